"""The message store under SIGKILL, with real node processes: a node killed in
the middle of a write-heavy workload comes back, recovers its ConsumeQueues
from its checkpoint and the committed log, and ends with files identical to
the leader's; every acknowledged message is in them, at a dense offset."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import grpc
import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
METADATA = [("x-mq-client-id", "recovery-test@1")]
TOPIC = "Recovery"


def queue_files(node_dir: Path) -> dict[str, bytes]:
    root = node_dir / "store" / "consumequeue" / TOPIC
    found: dict[str, bytes] = {}
    if root.is_dir():
        for queue in sorted(os.listdir(root)):
            for name in sorted(os.listdir(root / queue)):
                found[f"{queue}/{name}"] = (root / queue / name).read_bytes()
    return found


def count_units(data: bytes) -> int:
    """Units up to the first empty one (a commit log offset of 0 ends a queue)."""
    count = 0
    while count * 20 < len(data) and data[count * 20:count * 20 + 8] != bytes(8):
        count += 1
    return count


async def send_batch(stub: service_pb2_grpc.MessagingServiceStub, count: int) -> list[tuple[str, int]]:
    messages = [pb.Message(topic=pb.Resource(name=TOPIC), body=os.urandom(512),
                           system_properties=pb.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(),
                                                                 born_host="127.0.0.1"))
                for _ in range(count)]
    answer = await stub.SendMessage(spb.SendMessageRequest(messages=messages), metadata=METADATA, timeout=10)
    if answer.status.code != pb.OK:
        return []
    return [(m.system_properties.message_id, e.offset) for m, e in zip(messages, answer.entries)]


async def test_a_node_killed_mid_writes_recovers_queues_identical_to_the_leaders(tmp_path: Path):
    cluster = ProcessCluster(tmp_path)
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()))
    channels = {n: grpc.aio.insecure_channel(a) for n, a in cluster.addresses.items()}
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))
        stub = service_pb2_grpc.MessagingServiceStub(channels[leader])
        victim = next(n for n in cluster.ids if n != leader)
        acked: list[tuple[str, int]] = []
        stop = asyncio.Event()

        async def writer() -> None:
            while not stop.is_set():
                acked.extend(await send_batch(stub, 50))

        writers = [asyncio.ensure_future(writer()) for _ in range(4)]
        await asyncio.sleep(1.5)
        cluster.kill(victim)          # SIGKILL in the middle of the writes
        await asyncio.sleep(1.0)
        cluster.start(victim)         # same data dir
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*writers)
        assert len(acked) > 500

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = {n: queue_files(tmp_path / n) for n in cluster.ids}
            if files[leader] and files[victim] == files[leader] and files[victim] == files[
                    next(n for n in cluster.ids if n not in (leader, victim))]:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("the restarted node's ConsumeQueues never matched the leader's")

        units = {queue: count_units(data) for queue, data in files[leader].items()}
        assert sum(units.values()) >= len(acked)  # every acknowledged message has its unit
        per_offset: dict[int, int] = {}
        for _, offset in acked:
            per_offset[offset] = per_offset.get(offset, 0) + 1
        assert all(count <= 8 for count in per_offset.values())  # one per queue at each offset, no more
    finally:
        for channel in channels.values():
            await channel.close()
        await client.close()
        cluster.stop_all()
