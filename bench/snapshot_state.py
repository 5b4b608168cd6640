"""The event loop's share of a metadata snapshot of a big pop state. Prints
two JSON lines:

- "snapshot_state", no cluster: on the leader the capture (the encode runs
  in a worker thread), on a replica that lacks the state the adoption (the
  decode runs in a worker thread, the entries after it wait), and the
  longest the loop went without running while the worker decoded.
- "snapshot_writes_held": a one-node log (a real DLedgerServer and
  MessageStore on disk) whose leader holds the pop state, with one writer
  committing consumer offsets back to back (each waits until applied):
  the longest write while the leader writes a metadata snapshot against the
  longest in the second before it (writes_held_ms is the difference), the
  writes that began and ended within the snapshot, how long the snapshot
  took and its capture (on the loop), and the longest loop gap meanwhile
  (and in the second before: on a loaded machine, gaps that are not the
  snapshot's).

    python -m bench.snapshot_state [--leases 1000000]
"""
from __future__ import annotations

import argparse
import gc
import asyncio
import json
import os
import tempfile
import time
from typing import Any

from broker.consumer.pop_state import POP_OPS_KIND, LeaseRow, PopStateManager
from dledger.config import DLedgerConfig, PeerAddress
from dledger.rpc.inmemory import InMemoryNetwork
from dledger.server import DLedgerServer
from store.config import MessageStoreConfig
from store import message_store
from store.message_store import MessageStore
from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload
from store.socket_address import SocketAddress
from store.system_entry import SystemKind, decode_system_entry, encode_system_entry

NOW = 1_700_000_000_000


async def ticker(gaps: list[float], stop: asyncio.Event, ends: list[float] | None = None) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append((now - last) * 1000)
        if ends is not None:
            ends.append(now)
        last = now


async def run(leases: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as directory:
        leader = PopStateManager(directory)
        leader.apply(1, 100, {"ops": [{"op": "reset", "group": "G", "topic": "T", "queue": 0, "offset": 0}]})
        queue = leader.queue("G", "T", 0)
        assert queue is not None
        queue.restore(leases_of(leases))
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


def leases_of(count: int) -> dict[int, LeaseRow]:
    return {offset: (10 + offset // 32, NOW + offset % 50_000, 1, None) for offset in range(count)}


async def one_node_store(directory: str) -> tuple[DLedgerServer, MessageStore, PopStateManager]:
    network = InMemoryNetwork()
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 30000),),
                           data_dir=os.path.join(directory, "n0"), preallocate=False,
                           retention_check_interval_s=3600.0)
    server = DLedgerServer(config, network.transport("n0"))
    network.register(server)
    await server.start()
    store_config = MessageStoreConfig(store_dir=os.path.join(directory, "n0", "store"),
                                      metadata_snapshot_interval_s=3600.0, config_persist_interval_s=3600.0)
    store = MessageStore(store_config, server, SocketAddress("127.0.0.1", 30000))
    pop = PopStateManager(store_config.config_dir)
    store.add_manager(pop)
    await store.start()
    for task in store._tasks:
        if task.get_name() == "MetadataSnapshot":
            task.cancel()   # only the snapshot this bench writes
    deadline = time.monotonic() + 10
    while True:
        try:
            await store.ready_for_writes()
            break
        except Exception:  # noqa: BLE001 - not elected yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    return server, store, pop


async def run_writes_held(leases: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as directory:
        server, store, pop = await one_node_store(directory)
        try:
            await store.append_system_entry(POP_OPS_KIND, {"ops": [
                {"op": "reset", "group": "G", "topic": "T", "queue": 0, "offset": 0}]})
            queue = pop.queue("G", "T", 0)
            assert queue is not None
            queue.restore(leases_of(leases))
            # Out of the collector's generations, as an adopted state is: a
            # full collection walking a million leases (~0.1 s) is not the
            # snapshot's doing and would come at any time.
            gc.collect()
            gc.freeze()
            writes: list[tuple[float, float]] = []
            stop = asyncio.Event()

            async def writer() -> None:
                offset = 0
                while not stop.is_set():
                    offset += 1
                    started = time.perf_counter()
                    await store.commit_offsets([("G", "T", 0, offset)])
                    writes.append((started, time.perf_counter()))

            captures: list[float] = []
            capture = message_store.capture_payload

            def timed_capture(*args: Any) -> Any:
                begun = time.perf_counter()
                try:
                    return capture(*args)
                finally:
                    captures.append((time.perf_counter() - begun) * 1000)

            message_store.capture_payload = timed_capture   # type: ignore[assignment]
            gaps: list[float] = []
            ends: list[float] = []
            writing = asyncio.ensure_future(writer())
            watch = asyncio.ensure_future(ticker(gaps, stop, ends))
            await asyncio.sleep(1.0)   # the writes' own latency and loop gaps, before the snapshot
            before = len(writes)
            started = time.perf_counter()
            assert await store.write_metadata_snapshot()
            ended = time.perf_counter()
            await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(writing, watch)
        finally:
            message_store.capture_payload = capture   # type: ignore[assignment]
            await store.shutdown()
            await server.shutdown()
    baseline = max(((e - s) * 1000 for s, e in writes[:before]), default=0.0)
    during = max(((e - s) * 1000 for s, e in writes[before:] if s < ended and e > started), default=0.0)
    within = sum(1 for s, e in writes[before:] if s >= started and e <= ended)
    return {"bench": "snapshot_writes_held", "leases": leases, "writes_before": before,
            "writes_within_snapshot": within, "capture_ms": round(sum(captures), 1),
            "longest_write_before_ms": round(baseline, 1), "longest_write_during_snapshot_ms": round(during, 1),
            "writes_held_ms": round(max(0.0, during - baseline), 1),
            "snapshot_ms": round((ended - started) * 1000, 1),
            "longest_loop_gap_before_ms": round(max((g for g, e in zip(gaps, ends) if e < started), default=0), 1),
            "longest_loop_gap_during_snapshot_ms": round(max((g for g, e in zip(gaps, ends)
                                                              if e > started and e - g / 1000 < ended), default=0), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=1_000_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.leases))), flush=True)
    print(json.dumps(asyncio.run(run_writes_held(args.leases))), flush=True)


if __name__ == "__main__":
    main()
