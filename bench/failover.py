"""Failover time: SIGKILL the leader of a three-node cluster under a steady
append load and measure the time until the first append *invoked after the
kill* is acknowledged. Repeats for several rounds (the killed node is restarted
and caught up in between) and prints one JSON line per round, then a summary:

    python -m bench.failover [--rounds 5] [--dir /tmp/dledger-failover]

{"round", "killed", "new_leader", "failover_ms"} ... then
{"rounds", "median_ms", "worst_ms", "best_ms"}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

# Writers appending one entry each, back to back: enough to see the first
# moment the new leader commits without saturating the machine.
WRITERS = 4


async def measure_round(cluster: ProcessCluster, client: DLedgerClient, round_no: int) -> dict[str, object]:
    addresses = list(cluster.addresses.values())
    leader = await find_leader(client, addresses)
    killed_at = 0.0
    first_ack_after_kill: list[float] = []
    stop = asyncio.Event()

    async def writer(worker: int) -> None:
        n = 0
        while not stop.is_set():
            invoked = time.monotonic()
            try:
                await client.append([f"r{round_no}-w{worker}-{n}".encode()])
            except DLedgerError:
                pass
            n += 1
            if killed_at and invoked > killed_at:
                first_ack_after_kill.append(time.monotonic())
                stop.set()

    tasks = [asyncio.ensure_future(writer(w)) for w in range(WRITERS)]
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    cluster.kill(leader)
    await asyncio.wait_for(stop.wait(), 30)
    await asyncio.gather(*tasks)
    failover_ms = (min(first_ack_after_kill) - killed_at) * 1000
    new_leader = await find_leader(client, [a for n, a in cluster.addresses.items() if n != leader])
    cluster.start(leader)
    await wait_caught_up(client, addresses)
    return {"round": round_no, "killed": leader, "new_leader": new_leader, "failover_ms": round(failover_ms, 1)}


async def wait_caught_up(client: DLedgerClient, addresses: list[str], timeout: float = 30.0) -> None:
    result = await client.append([b"catch-up marker"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metas = [await client.metadata(a) for a in addresses]
        if all(m is not None and m.committed_index >= result.last_index for m in metas):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the restarted node did not catch up")


async def run(rounds: int, base: Path) -> None:
    cluster = ProcessCluster(base)
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()), deadline_s=30.0)
    results = []
    try:
        await find_leader(client, list(cluster.addresses.values()))
        for round_no in range(1, rounds + 1):
            result = await measure_round(cluster, client, round_no)
            results.append(result)
            print(json.dumps(result), flush=True)
            await asyncio.sleep(1.0)
    finally:
        await client.close()
        cluster.stop_all()
    times = [float(r["failover_ms"]) for r in results]
    print(json.dumps({"rounds": len(times), "median_ms": statistics.median(times),
                      "worst_ms": max(times), "best_ms": min(times)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="where the nodes keep their files (default: a temp dir, removed after)")
    args = parser.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dledger-failover-"))
    try:
        asyncio.run(run(args.rounds, base))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
