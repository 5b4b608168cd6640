"""What the broker tests share: raw-stub calls, a producer's Telemetry stream,
and a reader that sees what consumers would see.

`QueueReader` reads a node's ConsumeQueue files and commit log from its data
dir, read-only, while the node runs (both are written through the page
cache, so another process sees the writes at once): a message is visible to
consumers once its ConsumeQueue unit exists. (Until ReceiveMessage is on
main, this is how the tests observe consumption.)
"""
from __future__ import annotations

import asyncio
import os
import struct
import time
import uuid
from datetime import timedelta
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from store import codec
from store.codec import MessageExt

CLIENT_ID = "broker-test@1"
METADATA = [("x-mq-client-id", CLIENT_ID)]
_UNIT = struct.Struct(">qiq")


def new_message_id() -> str:
    return "01" + uuid.uuid4().hex.upper()


def message(topic: str, body: bytes = b"hello", user: dict[str, str] | None = None, **system: object) -> pb.Message:
    properties = pb.SystemProperties(message_id=system.pop("message_id", new_message_id()),  # type: ignore[arg-type]
                                     born_host="127.0.0.1", **system)  # type: ignore[arg-type]
    return pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=user or {},
                      system_properties=properties)


async def send(stub: service_pb2_grpc.MessagingServiceStub, *messages: pb.Message,
               metadata: list[tuple[str, str]] = METADATA) -> spb.SendMessageResponse:
    """SendMessage as a client makes it: retried while no leader is ready
    (same message ids, so a retry is not stored twice)."""
    request = spb.SendMessageRequest(messages=list(messages))
    return await retrying(lambda: stub.SendMessage(request, metadata=metadata, timeout=15))


def stubs_of(addresses: dict[str, str]) -> tuple[dict[str, grpc.aio.Channel], dict[str, service_pb2_grpc.MessagingServiceStub]]:
    channels = {node: grpc.aio.insecure_channel(address) for node, address in addresses.items()}
    return channels, {node: service_pb2_grpc.MessagingServiceStub(ch) for node, ch in channels.items()}


async def retrying(call, attempts: int = 40, pause: float = 0.25):
    """A call a client would retry (an election under way): HA_NOT_AVAILABLE,
    timeouts and connection failures are retried."""
    for attempt in range(attempts):
        try:
            answer = await call()
        except grpc.aio.AioRpcError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(pause)
            continue
        if answer.status.code not in (pb.HA_NOT_AVAILABLE, pb.SLAVE_PERSISTENCE_TIMEOUT) or attempt == attempts - 1:
            return answer
        await asyncio.sleep(pause)
    raise AssertionError("unreachable")


async def leader_of(cluster: ProcessCluster) -> str:
    client = DLedgerClient(list(cluster.addresses.values()))
    try:
        return await find_leader(client, list(cluster.addresses.values()))
    finally:
        await client.close()


async def wait_caught_up(cluster: ProcessCluster, timeout: float = 30.0) -> None:
    """Until every node holds the same log and votes. A node that starts
    late joins as a non-voter until it has caught up (it could have lost its
    disk); a leader killed before that leaves two nodes that cannot elect a
    new one until it returns (seen once on a loaded machine)."""
    addresses = list(cluster.addresses.values())
    client = DLedgerClient(addresses)
    try:
        deadline = time.monotonic() + timeout
        while True:
            states = [await client.metadata(address) for address in addresses]
            if all(s is not None and not s.repairing for s in states) and \
                    len({(s.ledger_end_index, s.committed_index) for s in states if s is not None}) == 1:
                return
            assert time.monotonic() < deadline, f"nodes not caught up within {timeout}s: {states}"
            await asyncio.sleep(0.05)
    finally:
        await client.close()


def recovery(seconds: float) -> Duration:
    duration = Duration()
    duration.FromTimedelta(timedelta(seconds=seconds))
    return duration


class QueueReader:
    """Read-only view of one node's ConsumeQueues and commit log."""

    def __init__(self, data_dir: Path, node_id: str) -> None:
        self.queues = data_dir / "store" / "consumequeue"
        self.log_dir = data_dir / f"dledger-{node_id}" / "data"

    def units(self, topic: str, queue_id: int) -> list[tuple[int, int]]:
        """(physical offset, size) of every unit of a queue, in queue order."""
        directory = self.queues / topic / str(queue_id)
        if not directory.is_dir():
            return []
        found: list[tuple[int, int]] = []
        # Segment files only: a node creates one as NAME.creating and renames
        # it, and a listing taken meanwhile names a file gone a moment later.
        for name in sorted(name for name in os.listdir(directory) if name.isdigit()):
            data = (directory / name).read_bytes()
            for at in range(0, len(data) - _UNIT.size + 1, _UNIT.size):
                physical, size, _ = _UNIT.unpack_from(data, at)
                if physical == 0 and size == 0:
                    return found  # the end of the queue
                if physical > 0:
                    found.append((physical, size))
        return found

    def read(self, physical_offset: int, size: int) -> MessageExt:
        segments = sorted(int(name) for name in os.listdir(self.log_dir) if name.isdigit())
        start = max(s for s in segments if s <= physical_offset)
        with open(self.log_dir / f"{start:020d}", "rb") as file:
            file.seek(physical_offset - start)
            return codec.decode(file.read(size))

    def messages(self, topic: str, queues: int) -> list[MessageExt]:
        return [self.read(p, s) for q in range(queues) for p, s in self.units(topic, q)]


class Watcher:
    """Polls a topic's ConsumeQueues and notes when each message first became
    visible (wall clock ms), by message id."""

    def __init__(self, reader: QueueReader, topic: str, queues: int) -> None:
        self.reader = reader
        self.topic = topic
        self.queues = queues
        self.seen: dict[str, tuple[int, MessageExt]] = {}
        self.copies: dict[str, int] = {}

    def poll(self) -> None:
        found = self.reader.messages(self.topic, self.queues)
        now = int(time.time() * 1000)  # after reading: nothing is noted as seen before it was there
        counts: dict[str, int] = {}
        for stored in found:
            message_id = stored.uniq_key or ""
            counts[message_id] = counts.get(message_id, 0) + 1
            self.seen.setdefault(message_id, (now, stored))
        self.copies = counts

    async def until(self, ids: set[str], timeout: float, interval: float = 0.02) -> None:
        deadline = time.monotonic() + timeout
        while not ids <= set(self.seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"not visible within {timeout}s: {sorted(ids - set(self.seen))}")
            self.poll()
            await asyncio.sleep(interval)


class TelemetryProducer:
    """A producer's Telemetry stream opened with raw stubs: announces its
    topics, then collects what the broker pushes (check-backs)."""

    def __init__(self, stub: service_pb2_grpc.MessagingServiceStub, client_id: str, topics: list[str]) -> None:
        self.client_id = client_id
        self.metadata = [("x-mq-client-id", client_id)]
        self.commands: asyncio.Queue[spb.TelemetryCommand] = asyncio.Queue()
        self._closed = asyncio.Event()
        settings = pb.Settings(client_type=pb.PRODUCER,
                               publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics]))
        self._call = stub.Telemetry(self._requests(spb.TelemetryCommand(settings=settings)), metadata=self.metadata)
        self._reader = asyncio.ensure_future(self._read())
        self.settled = asyncio.Event()

    async def _requests(self, first: spb.TelemetryCommand):
        yield first
        await self._closed.wait()

    async def _read(self) -> None:
        try:
            async for command in self._call:
                if command.HasField("settings"):
                    self.settled.set()
                else:
                    await self.commands.put(command)
        except grpc.aio.AioRpcError:
            pass

    async def check(self, timeout: float) -> spb.RecoverOrphanedTransactionCommand:
        command = await asyncio.wait_for(self.commands.get(), timeout)
        assert command.HasField("recover_orphaned_transaction_command"), command
        return command.recover_orphaned_transaction_command

    async def close(self) -> None:
        self._closed.set()
        self._call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
