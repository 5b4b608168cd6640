"""The event loop's longest stall during the log's housekeeping, at sizes
where it used to hurt: a producer table at its limits (10,000 producers x
64 sequences) snapshotted with one producer changed, a truncate that drops
a long tail, and retention deleting many segments. Each is measured the way
it runs in a node (the loop's part on the loop, the rest in the flush
thread) with a LoopLagMonitor ticking beside it; "before" repeats what
earlier versions did on the loop (the whole table encoded; deletion and
checkpoint fsyncs on the loop), for comparison. Prints one JSON line (ms).

    python -m bench.loop_stalls [--producers 10000] [--segments 200]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Awaitable, Callable

from dledger.config import DLedgerConfig, PeerAddress
from dledger.loop_lag import LoopLagMonitor
from dledger.producer_table import Mark, ProducerTable, Snapshot
from dledger.store.properties import write_atomic
from dledger.store.file_store import DLedgerFileStore

SEGMENT = 1 << 20


async def longest_stall(action: Callable[[], Awaitable[object]]) -> float:
    monitor = LoopLagMonitor(window_s=3600)
    task = asyncio.get_running_loop().create_task(monitor.run())
    await asyncio.sleep(0.05)
    await action()
    await asyncio.sleep(0.05)
    task.cancel()
    return round(monitor.lag_s * 1000, 1)


def producer_table(producers: int) -> ProducerTable:
    table = ProducerTable()
    index = 0
    for sequence in range(table.sequences):
        for p in range(producers):
            table.apply_mark(index, Mark(f"producer-{p:05d}", sequence, 1, 1_700_000_000_000 + index // 1000))
            index += 2
    table.advance(index)
    table.to_json()   # the first snapshot: everything encoded once
    return table


async def store_with_segments(directory: str, segments: int) -> DLedgerFileStore:
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1),), data_dir=directory,
                           data_file_size=SEGMENT, index_file_size=32 * 8192, preallocate=True)
    store = DLedgerFileStore(config)
    store.open()
    body = os.urandom(64 << 10)
    while len(store._data.segments) < segments:
        store.append_as_leader([body] * 8, term=1)
    await store.flush()
    store.set_committed_index(store.ledger_end_index // 2)
    store.write_checkpoint()
    return store


async def measure(producers: int, segments: int) -> dict[str, float]:
    result: dict[str, float] = {}
    table = producer_table(producers)
    path = os.path.join(tempfile.mkdtemp(), "producers")
    table.apply_mark(10**9, Mark("producer-00001", table.sequences, 1, 1_700_000_010_000))
    table.advance(10**9 + 1)

    async def snapshot_now() -> None:
        encode = table.capture()
        assert encode is not None
        def write() -> Snapshot:
            snapshot = encode()
            write_atomic(path, snapshot.chunks())
            return snapshot

        table.keep(await asyncio.to_thread(write))

    result["producer_snapshot_ms"] = await longest_stall(snapshot_now)

    async def snapshot_before() -> None:
        table._changed = set(table._producers)   # every producer encoded on the loop, as before
        write_atomic(path, table.to_json().encode())

    result["producer_snapshot_before_ms"] = await longest_stall(snapshot_before)
    with tempfile.TemporaryDirectory() as directory:
        store = await store_with_segments(directory, segments)

        async def truncate() -> None:
            store.truncate(store.ledger_end_index // 2 + 1)

        result["truncate_half_ms"] = await longest_stall(truncate)
        store.close()
    for variant in ("now", "before"):
        with tempfile.TemporaryDirectory() as directory:
            store = await store_with_segments(directory, segments)
            keep = store.committed_index

            async def retention() -> None:
                if variant == "now":
                    await store.delete_expired_in_background(keep, time.time() + 60)
                else:
                    store.delete_expired(keep, time.time() + 60)

            result[f"retention_{variant}_ms"] = await longest_stall(retention)
            store.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=10_000)
    parser.add_argument("--segments", type=int, default=200)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.producers, args.segments))
    print(json.dumps({"producers": args.producers, "segments": args.segments, **figures}))


if __name__ == "__main__":
    main()
