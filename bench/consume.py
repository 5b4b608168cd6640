"""Pop consumption throughput: messages per second received and acked (one
AckMessage per received batch), 1 KiB messages, on a local three-node cluster.

    python -m bench.consume [--servers H:P,...] [--messages 100000] [--size 1024]
                            [--batch 32] [--consumers 16] [--processes 2] [--front-ends] [--json]

Without --servers it starts its own cluster (cluster/process_cluster.py) in a
temporary directory; with --front-ends that cluster has front ends
(broker/config.py) and the consumers go through one (a follower's port,
which forwards every call to the leader) instead of to the leader: the
cost of the extra hop. It first fills a fresh topic (batched SendMessage), then
client processes, each with several concurrent receive loops, receive and ack
until the topic is drained. Prints one JSON line:

    {"messages", "size", "batch", "consumers", "processes", "fill_per_s",
     "received_per_s", "acked_per_s", "seconds", "receive_p50_ms", "receive_p99_ms",
     "ack_p50_ms", "ack_p99_ms", "redelivered"}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from bench.proc_cpu import CpuMeter
from cluster.process_cluster import DEFAULT_NODE_FILES, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

SEND_BATCH = 64
SENDERS = 4


def _metadata(name: str) -> list[tuple[str, str]]:
    return [("x-mq-client-id", f"bench-consume-{name}@{uuid.uuid4().hex[:8]}")]


async def fill(address: str, topic: str, count: int, size: int) -> float:
    """Send `count` messages; returns messages/s."""
    body = b"x" * size
    metadata = _metadata("fill")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        remaining = iter(range(0, count, SEND_BATCH))

        async def sender() -> None:
            for start in remaining:
                n = min(SEND_BATCH, count - start)
                messages = [pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=pb.SystemProperties(
                    message_id="01" + uuid.uuid4().hex.upper(), born_host="127.0.0.1")) for _ in range(n)]
                answer = await stub.SendMessage(spb.SendMessageRequest(messages=messages), metadata=metadata,
                                                timeout=30)
                if answer.status.code != pb.OK:
                    raise RuntimeError(f"send failed: {answer.status}")

        started = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(SENDERS)))
        return count / (time.monotonic() - started)


async def consume(addresses: list[str], topic: str, group: str, loops: int, batch: int, worker: int
                  ) -> dict[str, Any]:
    """Receive and ack until a receive comes back empty; per-loop results."""
    metadata = _metadata(f"w{worker}")
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
    receive_ms: list[float] = []
    ack_ms: list[float] = []
    seen: set[str] = set()
    counts = {"received": 0, "acked": 0, "redelivered": 0, "errors": 0, "last_ack": 0.0}
    cpu_at_start = time.process_time()

    async def loop(index: int) -> None:
        stub = stubs[0]
        queue = (worker * loops + index) % 8
        while True:
            request = spb.ReceiveMessageRequest(
                group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=batch,
                invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=5))
            started = time.monotonic()
            responses = [r async for r in stub.ReceiveMessage(request, metadata=metadata, timeout=15)]
            receive_ms.append((time.monotonic() - started) * 1000)
            messages = [r.message for r in responses if r.HasField("message")]
            status = next(r.status for r in responses if r.HasField("status"))
            if status.code != pb.OK:
                counts["errors"] += 1     # e.g. a leader change: try again
                await asyncio.sleep(0.1)
                continue
            if not messages:
                return
            counts["received"] += len(messages)
            for m in messages:
                if m.system_properties.message_id in seen:
                    counts["redelivered"] += 1
                seen.add(m.system_properties.message_id)
            started = time.monotonic()
            answer = await stub.AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                entries=[spb.AckMessageEntry(message_id=m.system_properties.message_id,
                                             receipt_handle=m.system_properties.receipt_handle) for m in messages]),
                metadata=metadata, timeout=15)
            ack_ms.append((time.monotonic() - started) * 1000)
            counts["acked"] += sum(e.status.code == pb.OK for e in answer.entries)
            counts["last_ack"] = time.time()
            queue = (queue + 1) % 8

    await asyncio.gather(*(loop(i) for i in range(loops)))
    for channel in channels:
        await channel.close()
    return {**counts, "receive_ms": receive_ms, "ack_ms": ack_ms, "ids": sorted(seen),
            "cpu_s": time.process_time() - cpu_at_start}


def _worker(addresses: list[str], topic: str, group: str, loops: int, batch: int, worker: int,
            start_at: float, results: Any) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    results.put(asyncio.run(consume(addresses, topic, group, loops, batch, worker)))


async def leader_of(addresses: list[str], timeout: float = 15.0) -> tuple[str, str]:
    """(id, address) of the node that says it leads."""
    client = DLedgerClient(addresses)
    try:
        leader = await find_leader(client, addresses, timeout)
        for address in addresses:
            meta = await client.metadata(address)
            if meta is not None and meta.self_id == leader:
                return leader, address
    finally:
        await client.close()
    raise TimeoutError("the leader's address is not among the servers given")


async def first_open(addresses: list[str], timeout: float = 10.0) -> str:
    """The first front end that answers (the leader's is closed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for address in addresses:
            async with grpc.aio.insecure_channel(address) as channel:
                try:
                    await asyncio.wait_for(channel.channel_ready(), 0.5)
                    return address
                except asyncio.TimeoutError:
                    continue
    raise TimeoutError(f"no front end open among {','.join(addresses)}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def run(args: argparse.Namespace, addresses: list[str], pids: dict[str, int] | None = None,
              front_ends: list[str] | None = None) -> dict[str, Any]:
    leader, leader_address = await leader_of(addresses)
    # Clients talk to the leader; given front ends, to the first that is open
    # (a follower's, which forwards every call: the extra hop's cost).
    addresses = [leader_address] + [a for a in addresses if a != leader_address]
    consumer_addresses = addresses
    if front_ends:
        consumer_addresses = [await first_open(front_ends)]
    topic, group = f"BenchConsume{uuid.uuid4().hex[:6]}", f"BenchGroup{uuid.uuid4().hex[:6]}"
    fill_rate = await fill(leader_address, topic, args.messages, args.size)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    loops = max(1, args.consumers // args.processes)
    start_at = time.time() + 1.5   # let every process import and connect first
    meter = CpuMeter(pids or {})
    meter.start()
    processes = [context.Process(target=_worker, args=(consumer_addresses, topic, group, loops, args.batch, w,
                                                       start_at, results)) for w in range(args.processes)]
    for process in processes:
        process.start()
    parts = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    nodes = meter.node_seconds()
    seconds = max(p["last_ack"] for p in parts) - start_at
    received = sum(p["received"] for p in parts)
    acked = sum(p["acked"] for p in parts)
    ids = [i for p in parts for i in p["ids"]]
    return {"messages": args.messages, "size": args.size, "batch": args.batch, "consumers": loops * args.processes,
            "processes": args.processes, "leader": leader, "via": consumer_addresses[0],
            "front_ends": bool(front_ends), "fill_per_s": round(fill_rate),
            "received": received, "acked": acked, "distinct": len(set(ids)),
            "received_per_s": round(received / seconds), "acked_per_s": round(acked / seconds),
            "seconds": round(seconds, 2),
            "receive_p50_ms": percentile([x for p in parts for x in p["receive_ms"]], 0.5),
            "receive_p99_ms": percentile([x for p in parts for x in p["receive_ms"]], 0.99),
            "ack_p50_ms": percentile([x for p in parts for x in p["ack_ms"]], 0.5),
            "ack_p99_ms": percentile([x for p in parts for x in p["ack_ms"]], 0.99),
            "redelivered": sum(p["redelivered"] for p in parts) + len(ids) - len(set(ids)),
            "errors": sum(p["errors"] for p in parts),
            # CPU each node (own cluster only) and the consumer processes
            # spent during the consume phase: where the time goes on a
            # machine the benchmark shares.
            "node_cpu_s": {node: round(seconds, 2) for node, seconds in nodes.items()},
            "cpu_us_per_message": meter.per_message(acked, sum(p["cpu_s"] for p in parts), "consumers", nodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="a running cluster's gRPC addresses (default: start one)")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--consumers", type=int, default=16, help="concurrent receive loops in all")
    parser.add_argument("--processes", type=int, default=2, help="client processes the loops are spread over")
    parser.add_argument("--dir", help="where a started cluster keeps its files (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--front-ends", action="store_true",
                        help="start the cluster with front ends and consume through one (the extra hop's cost)")
    args = parser.parse_args()
    if args.servers:
        print(json.dumps(asyncio.run(run(args, args.servers.split(",")))))
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dledger-bench-consume-"))
    cluster = ProcessCluster(base, extra_args=DEFAULT_NODE_FILES, front_ends=args.front_ends)
    cluster.start()
    try:
        pids = {node: proc.pid for node, proc in cluster.procs.items()}
        print(json.dumps(asyncio.run(run(args, list(cluster.addresses.values()), pids,
                                         list(cluster.front_ends.values())))))
    finally:
        cluster.stop_all()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
