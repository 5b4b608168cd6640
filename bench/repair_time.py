"""How long a node takes to re-fetch its log after losing its disk: three
real node processes, `--mib` MiB of committed entries, then one follower is
killed, its data directory deleted and the node restarted; the clock runs
until it reports itself repaired (a voter again) with the leader's log end.
Prints one JSON line.

    python -m bench.repair_time [--mib 1024]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient

ENTRY = 64 << 10


async def fill(client: DLedgerClient, mib: int) -> None:
    body = os.urandom(ENTRY)
    batches = mib * (1 << 20) // (ENTRY * 16)

    async def writer(worker: int) -> None:
        for _ in range(worker, batches, 8):
            await client.append([body] * 16)

    await asyncio.gather(*(writer(w) for w in range(8)))


async def measure(mib: int, base: Path) -> dict[str, float]:
    cluster = ProcessCluster(base, extra_args=["--data-file-size", str(256 << 20), "--max-entry-size", str(1 << 20)])
    cluster.start()
    try:
        async with DLedgerClient(list(cluster.addresses.values()), deadline_s=60.0) as client:
            leader = await find_leader(client, list(cluster.addresses.values()))
            started = time.monotonic()
            await fill(client, mib)
            fill_s = time.monotonic() - started
            victim = next(n for n in cluster.ids if n != leader)
            cluster.kill(victim)
            shutil.rmtree(base / victim)
            end = (await client.metadata(cluster.addresses[leader])).ledger_end_index
            started = time.monotonic()
            cluster.start(victim)
            while True:
                meta = await client.metadata(cluster.addresses[victim])
                if meta is not None and not meta.repairing and meta.ledger_end_index >= end and meta.cluster_id:
                    break
                await asyncio.sleep(0.05)
            repair_s = time.monotonic() - started
    finally:
        cluster.kill_all()
    return {"mib": mib, "fill_s": round(fill_s, 1), "repair_s": round(repair_s, 1),
            "repair_mib_per_s": round(mib / repair_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as directory:
        print(json.dumps({"bench": "repair_time", **asyncio.run(measure(args.mib, Path(directory)))}))


if __name__ == "__main__":
    main()
