"""Producing committed data for the Spark tests with the real parts: node
processes and their RocketMQ protocol, or in-process MessageStores on real
DLedgerServers (tests/unit/store_harness.py)."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass

import grpc
import pyarrow as pa

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.store.properties import read_properties
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from rpcgen.pydledger.admin.v1 import operations_pb2 as opb
from rpcgen.pydledger.admin.v1 import operations_pb2_grpc

METADATA = [("x-mq-client-id", "spark-test@1")]


@dataclass(frozen=True)
class Sent:
    message_id: str
    topic: str
    body: bytes
    tag: str
    keys: tuple[str, ...]
    queue_offset: int


def rocketmq_message(topic: str, body: bytes, tag: str, keys: list[str]) -> pb.Message:
    properties = pb.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(), born_host="127.0.0.1",
                                     tag=tag, keys=keys, message_type=pb.NORMAL)
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=properties)


async def send_messages(address: str, topic: str, count: int, batch: int = 50) -> list[Sent]:
    """Send `count` messages through the RocketMQ 5 protocol, `batch` per call."""
    sent: list[Sent] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for start in range(0, count, batch):
            messages = [rocketmq_message(topic, b"%s-%d-" % (topic.encode(), i) + os.urandom(400), f"tag{i % 3}",
                                         [f"k{i}", f"order-{i % 7}"]) for i in range(start, min(count, start + batch))]
            answer = await stub.SendMessage(spb.SendMessageRequest(messages=messages), metadata=METADATA, timeout=20)
            assert answer.status.code == pb.OK, answer.status.message
            for message, entry in zip(messages, answer.entries):
                props = message.system_properties
                sent.append(Sent(entry.message_id, topic, message.body, props.tag, tuple(props.keys), entry.offset))
    return sent


def checkpoint_committed_index(node_dir: str, node_id: str) -> int:
    """-1 until the node has written its first checkpoint."""
    path = os.path.join(node_dir, f"dledger-{node_id}", "checkpoint")
    return int(read_properties(path)["committedIndex"]) if os.path.exists(path) else -1


def wait_for_checkpoint(node_dir: str, node_id: str, index: int, timeout: float = 15.0) -> int:
    """A running node records its committed index every few seconds: wait for `index`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed = checkpoint_committed_index(node_dir, node_id)
        if committed >= index:
            return committed
        time.sleep(0.1)
    raise AssertionError(f"{node_dir}: checkpoint did not reach index {index} within {timeout}s")


_LOOP = asyncio.new_event_loop()


def run(coroutine):  # noqa: ANN001, ANN201 - a tiny sync bridge for sync Spark tests
    """One loop for the whole test process: gRPC's asyncio support binds to the first loop it sees."""
    return _LOOP.run_until_complete(coroutine)


def topic_rows(servers: str, topic: str) -> list[dict]:
    """The messages of `topic` in the committed log, read live with the
    reference (row by row) decoder."""
    from spark.live_log import committed_bounds, live_entries
    from spark.partitions import LiveRange
    from spark.row_builder import scanned_record_batches

    addresses = tuple(servers.split(","))
    begin, committed = committed_bounds(addresses, "default")
    part = LiveRange(addresses, "default", begin, committed)
    batches = list(scanned_record_batches(live_entries(part), frozenset({topic})))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


async def leader_of(cluster: ProcessCluster) -> str:
    """The group's leader, once elected (a loaded machine: up to 60 s)."""
    servers = list(cluster.addresses.values())
    async with DLedgerClient(servers) as client:
        return await find_leader(client, servers, timeout=60.0)


async def committed_entries(servers: str | list[str]) -> dict[int, bytes]:
    """index -> body of every committed NORMAL entry, as the leader serves them."""
    async with DLedgerClient(servers) as client:
        return {entry.index: entry.body async for entry in client.read()}


async def wait_followers_committed(cluster: ProcessCluster, index: int, timeout: float = 15.0) -> None:
    """Every node of the cluster has learnt that `index` is committed."""
    servers = list(cluster.addresses.values())
    async with DLedgerClient(servers) as client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answers = [await client.metadata(a) for a in servers]
            if all(a is not None and a.committed_index >= index for a in answers):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"followers did not learn commit {index}")


async def wait_applied(address: str, index: int, timeout: float = 15.0) -> None:
    """The node's message store has applied every entry up to `index`: its
    apply loop has read them back (checked) from the node's disk."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = operations_pb2_grpc.OperationsServiceStub(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = await stub.DescribeStore(opb.DescribeStoreRequest(), timeout=2)
            if answer.applied_index >= index:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{address} did not apply entry {index}")
