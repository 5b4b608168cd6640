"""The event loop's share of a metadata snapshot of a big pop state, no
cluster: on the leader the capture (the encode runs in a worker thread), on
a replica that lacks the state the adoption (the decode runs in a worker
thread, the entries after it wait). Also the longest the loop went without
running while the worker decoded (the worker holds the GIL in slices).
Prints one JSON line.

    python -m bench.snapshot_state [--leases 1000000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

from broker.consumer.pop_state import Lease, PopStateManager
from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload
from store.system_entry import SystemKind, decode_system_entry, encode_system_entry

NOW = 1_700_000_000_000


async def ticker(gaps: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append((now - last) * 1000)
        last = now


async def run(leases: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as directory:
        leader = PopStateManager(directory)
        leader.apply(1, 100, {"ops": [{"op": "reset", "group": "G", "topic": "T", "queue": 0, "offset": 0}]})
        queue = leader.queue("G", "T", 0)
        assert queue is not None
        queue.restore({offset: Lease(10 + offset // 32, NOW + offset % 50_000, 1) for offset in range(leases)})
        started = time.perf_counter()
        payload = capture_payload([leader])
        capture_ms = (time.perf_counter() - started) * 1000
        body = encode_system_entry(SystemKind.METADATA_SNAPSHOT, payload())
        replica = PopStateManager(directory)
        handler = MetadataSnapshotHandler([replica])
        handler.start(-1, log_lost_entries=True)
        gaps: list[float] = []
        stop = asyncio.Event()
        watch = asyncio.ensure_future(ticker(gaps, stop))
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        entry = decode_system_entry(memoryview(body))
        handler.apply(2, entry.kind, entry.payload)
        adopt_ms = (time.perf_counter() - started) * 1000
        restored = getattr(replica, "restored", None)
        if restored is not None:
            await restored()
        total_ms = (time.perf_counter() - started) * 1000
        stop.set()
        await watch
        assert len(replica.queue("G", "T", 0).in_flight) == leases  # type: ignore[union-attr]
    return {"bench": "snapshot_state", "leases": leases, "entry_bytes": len(body),
            "capture_on_loop_ms": round(capture_ms, 1), "adopt_on_loop_ms": round(adopt_ms, 1),
            "adopt_total_ms": round(total_ms, 1), "longest_loop_gap_ms": round(max(gaps, default=0), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=1_000_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.leases))), flush=True)


if __name__ == "__main__":
    main()
