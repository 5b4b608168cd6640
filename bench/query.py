"""Message query benchmark (issue 19): how fast a key finds its message among
N stored ones, through the whole path a user takes (gRPC OperationsService
-> IndexFile hash slot -> commit log read and key check). One JSON line per
result:

  apply      seconds for a node to derive its ConsumeQueues and IndexFile
             from the N committed messages (what every replica does)
  by_key     latency of QueryMessageByKey for a random message's unique key
             (p50, p99, max over --queries sequential calls)
  by_shared_key  the same for a key that N/10,000 messages share (32 answered)
  by_id      QueryMessageById with a client message id (every topic searched)

    python -m bench.query [--messages 100000] [--queries 500] [--corpus DIR]

The corpus is one node's log written directly by DLedger's file store (like
bench/replay.py): a topic config entry, then N messages of 100-byte bodies
with KEYS "order-<i> user-<i % 10000>" and a client message id, committed.
A node is then started on it with the default IndexFile geometry (5 million
slots, 20 million items) and queried once it has applied everything. With
--corpus the log is kept and reused (the index is rebuilt on every run).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

from broker.client.operations import OperationsClient
from cluster.process_cluster import SMALL_NODE_FILES, ProcessCluster
from dledger.config import DLedgerConfig, PeerAddress
from dledger.entry import CHANNEL_STATE_MACHINE
from dledger.store.file_store import DLedgerFileStore
from rpcgen.pydledger.admin.v1 import operations_pb2 as opb
from rpcgen.pydledger.admin.v1 import operations_pb2_grpc
from store.codec import MessageExt, encode, patch_offsets
from store.socket_address import SocketAddress
from store.system_entry import SystemKind, encode_system_entry
from store.topic_config import TopicConfig, topic_update_payload

TOPIC = "BenchQuery"
QUEUES = 8
BODY = b"q" * 100
APPEND_BATCH = 5000
SHARED_KEYS = 10_000
# The node's data files: SMALL_NODE_FILES' sizes, which the corpus must match.
DATA_FILE_SIZE = 64 << 20
INDEX_FILE_SIZE = 32 << 16


def uniq_key(i: int) -> str:
    return f"01{i:032X}"


def make_corpus(node_dir: str, count: int) -> dict[str, Any]:
    marker = os.path.join(node_dir, "corpus.json")
    if os.path.exists(marker):
        info = json.loads(Path(marker).read_text())
        if info["messages"] == count:
            return info  # type: ignore[no-any-return]
        shutil.rmtree(node_dir)
    os.makedirs(node_dir, exist_ok=True)
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1),), data_dir=node_dir,
                           preallocate=False, data_file_size=DATA_FILE_SIZE, index_file_size=INDEX_FILE_SIZE)
    log = DLedgerFileStore(config)
    log.open()
    started = time.monotonic()
    topic = TopicConfig(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    log.append_as_leader([encode_system_entry(SystemKind.TOPIC_UPDATE, topic_update_payload(topic))], term=1,
                         channel=CHANNEL_STATE_MACHINE)
    host = SocketAddress("127.0.0.1", 10911)
    now = int(time.time() * 1000) - count  # one message a millisecond, ending now
    offsets = [0] * QUEUES
    for first in range(0, count, APPEND_BATCH):
        bodies = []
        for i in range(first, min(count, first + APPEND_BATCH)):
            queue = i % QUEUES
            message = MessageExt(topic=TOPIC, body=BODY, queue_id=queue, queue_offset=offsets[queue],
                                 born_timestamp=now + i, store_timestamp=now + i, born_host=host, store_host=host,
                                 properties={"TAGS": "bench", "KEYS": f"order-{i} user-{i % SHARED_KEYS}",
                                             "UNIQ_KEY": uniq_key(i)})
            offsets[queue] += 1
            bodies.append(bytearray(encode(message)))

        def place(positions: list[int], batch: list[bytearray] = bodies) -> None:
            for body, position in zip(batch, positions):  # what DLedgerCommitLog's append hook does
                patch_offsets(body, int.from_bytes(body[20:28], "big"), position + 48)
        log.append_as_leader(bodies, term=1, prepare=place, channel=CHANNEL_STATE_MACHINE)
    log.set_committed_index(log.ledger_end_index)
    log.close()
    info = {"messages": count, "log_bytes": log.write_position, "committed_index": log.ledger_end_index,
            "generate_s": round(time.monotonic() - started, 1)}
    Path(marker).write_text(json.dumps(info))
    return info


def emit(name: str, **values: Any) -> None:
    print(json.dumps({"bench": "query", "name": name, **values}), flush=True)


async def wait_applied(address: str, index: int, timeout: float) -> float:
    """Seconds until the node at `address` has applied entry `index`."""
    started = time.monotonic()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = operations_pb2_grpc.OperationsServiceStub(channel)
        while time.monotonic() - started < timeout:
            try:
                answer = await stub.DescribeStore(opb.DescribeStoreRequest(), timeout=2)
                if answer.applied_index >= index:
                    return time.monotonic() - started
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"the node did not apply entry {index} within {timeout} s")


async def latencies(queries: int, ask: Callable[[int], Awaitable[int]], count: int) -> dict[str, Any]:
    rng = random.Random(19)
    took: list[float] = []
    found = 0
    for _ in range(queries):
        i = rng.randrange(count)
        started = time.perf_counter()
        found += await ask(i)
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return {"queries": queries, "found": found, "p50_ms": round(statistics.median(took), 2),
            "p99_ms": round(took[min(len(took) - 1, int(len(took) * 0.99))], 2), "max_ms": round(took[-1], 2)}


async def run(args: argparse.Namespace) -> None:
    base = Path(args.corpus or tempfile.mkdtemp(prefix="bench-query-"))
    node_dir = base / "n0"
    info = make_corpus(str(node_dir), args.messages)
    # The derived store (index, queues, checkpoint) is rebuilt every run.
    shutil.rmtree(node_dir / "store", ignore_errors=True)
    emit("corpus", **info)
    cluster = ProcessCluster(base, size=1, extra_args=[*SMALL_NODE_FILES])
    cluster.start()
    try:
        address = cluster.addresses["n0"]
        apply_s = await wait_applied(address, info["committed_index"], timeout=args.apply_timeout)
        emit("apply", messages=args.messages, seconds=round(apply_s, 1),
             messages_per_s=round(args.messages / max(apply_s, 1e-9)))
        async with OperationsClient(address) as ops:
            async def by_key(i: int) -> int:
                return len(await ops.query_by_key(TOPIC, f"order-{i}"))

            async def by_shared_key(i: int) -> int:
                return min(1, len(await ops.query_by_key(TOPIC, f"user-{i % SHARED_KEYS}", max_results=32)))

            async def by_id(i: int) -> int:
                return len(await ops.query_by_id(uniq_key(i)))

            await by_key(0)  # the first call opens the channel
            emit("by_key", messages=args.messages, **await latencies(args.queries, by_key, args.messages))
            emit("by_shared_key", messages=args.messages, shared_by=args.messages // SHARED_KEYS or 1,
                 **await latencies(args.queries, by_shared_key, args.messages))
            emit("by_id", messages=args.messages, **await latencies(args.queries, by_id, args.messages))
    finally:
        cluster.stop_all()
        if not args.corpus:
            shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.query", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages stored (default 100,000)")
    parser.add_argument("--queries", type=int, default=500, help="queries per kind (default 500)")
    parser.add_argument("--corpus", help="keep the node's log here and reuse it (default: a temp dir)")
    parser.add_argument("--apply-timeout", type=float, default=600.0, metavar="SECONDS")
    args = parser.parse_args()
    if args.messages < 1 or args.queries < 1:
        parser.error("--messages and --queries must be positive")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
