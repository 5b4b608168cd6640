"""Message store benchmarks (issue 3), one JSON line per result:

  put   messages/s through put -> commit -> apply on three node processes
        (SendMessage, 1 KiB bodies, single and batched), and how long after
        the last acknowledgement every replica had applied everything
  pull  messages/s read from a ConsumeQueue (32 per pull, bodies decoded)
  recovery  seconds from starting a node that was SIGKILLed with about
        --recovery-mib of log until it serves (its store recovered)

    python -m bench.store [--duration 10] [--recovery-mib 1024]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

METADATA = [("x-mq-client-id", "bench-store@1")]
BODY = os.urandom(1024)
TOPIC = "BenchStore"
# Node files: 64 MiB data segments keep the benchmark's disk use near what it writes.
NODE_ARGS = ["--data-file-size", str(64 << 20), "--preallocate", "false"]


def messages(count: int) -> list[pb.Message]:
    return [pb.Message(topic=pb.Resource(name=TOPIC), body=BODY,
                       system_properties=pb.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(),
                                                             born_host="127.0.0.1"))
            for _ in range(count)]


async def put_rate(stub: service_pb2_grpc.MessagingServiceStub, batch: int, inflight: int,
                   duration: float) -> tuple[int, float]:
    acked = 0
    stop_at = time.perf_counter() + duration

    async def sender() -> None:
        nonlocal acked
        while time.perf_counter() < stop_at:
            answer = await stub.SendMessage(spb.SendMessageRequest(messages=messages(batch)),
                                            metadata=METADATA, timeout=30)
            if answer.status.code == pb.OK:
                acked += batch

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(inflight)))
    return acked, time.perf_counter() - started


def units_in(node_dir: Path) -> int:
    """ConsumeQueue units of the benchmark topic a node has written."""
    root = node_dir / "store" / "consumequeue" / TOPIC
    total = 0
    for queue in root.iterdir() if root.is_dir() else ():
        for name in sorted(queue.iterdir()):
            data = name.read_bytes()
            count = 0
            while count * 20 < len(data) and data[count * 20:count * 20 + 8] != bytes(8):
                count += 1
            total += count
    return total


async def bench_put(base: Path, duration: float) -> list[dict[str, object]]:
    cluster = ProcessCluster(base, extra_args=NODE_ARGS)
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()))
    results = []
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))
        async with grpc.aio.insecure_channel(cluster.addresses[leader]) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            await stub.SendMessage(spb.SendMessageRequest(messages=messages(1)), metadata=METADATA, timeout=30)
            total = 1
            for batch, inflight in ((1, 1), (1, 32), (64, 8)):
                acked, elapsed = await put_rate(stub, batch, inflight, duration)
                total += acked
                done_at = time.perf_counter()
                while any(units_in(base / node) < total for node in cluster.ids):
                    await asyncio.sleep(0.05)
                results.append({"bench": "put", "batch": batch, "inflight": inflight, "messages": acked,
                                "messages_per_s": round(acked / elapsed, 1),
                                "apply_lag_s": round(time.perf_counter() - done_at, 3)})
    finally:
        await client.close()
        cluster.stop_all()
    return results


async def bench_pull(base: Path, count: int) -> dict[str, object]:
    from tests.unit.store_harness import StoreCluster, message  # one node, real files, in process

    cluster = StoreCluster(str(base), size=1, store={"consume_queue_units_per_file": 300_000})
    await cluster.start()
    try:
        await cluster.create_topic(TOPIC, queues=1)
        store = await cluster.leader_store()
        for _ in range(count // 500):
            await store.put_messages([message(TOPIC, BODY) for _ in range(500)])
        await cluster.wait_applied(timeout=60)
        started = time.perf_counter()
        offset, read = 0, 0
        while True:
            got = store.get_messages(TOPIC, 0, offset, 32)
            if not got.messages:
                break
            read += len(got.messages)
            offset = got.next_offset
        elapsed = time.perf_counter() - started
    finally:
        await cluster.stop()
    return {"bench": "pull", "messages": read, "per_pull": 32, "messages_per_s": round(read / elapsed, 1)}


async def bench_recovery(base: Path, mib: int) -> dict[str, object]:
    cluster = ProcessCluster(base, extra_args=NODE_ARGS)
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()))
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))
        async with grpc.aio.insecure_channel(cluster.addresses[leader]) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            target = mib * 1024
            written = 0
            while written < target:
                await asyncio.gather(*(stub.SendMessage(spb.SendMessageRequest(messages=messages(64)),
                                                        metadata=METADATA, timeout=60) for _ in range(8)))
                written += 512
        victim = next(n for n in cluster.ids if n != leader)
        await asyncio.sleep(1.0)
        cluster.kill(victim)
        started = time.perf_counter()
        cluster.start(victim)
        async with grpc.aio.insecure_channel(cluster.addresses[victim]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)
        return {"bench": "recovery", "log_mib": mib, "seconds": round(time.perf_counter() - started, 2)}
    finally:
        await client.close()
        cluster.stop_all()


async def main(duration: float, recovery_mib: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        for result in await bench_put(base / "put", duration):
            print(json.dumps(result), flush=True)
        print(json.dumps(await bench_pull(base / "pull", 50_000)), flush=True)
        if recovery_mib:
            print(json.dumps(await bench_recovery(base / "recovery", recovery_mib)), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--recovery-mib", type=int, default=1024)
    args = parser.parse_args()
    asyncio.run(main(args.duration, args.recovery_mib))
