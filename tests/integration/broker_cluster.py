"""Helpers for tests of broker.client against real node processes: a cluster
with its leader, and what the committed log holds (read with the DLedger
client and decoded with the store's codec, independently of the broker's
consumption RPCs)."""
from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from store import codec
from store.codec import MessageExt
from store.errors import MessageDecodeError


# Test clusters keep sparse segment files: 1 GiB preallocated per segment and
# node would fill a shared disk with a few test modules' leftovers.
SPARSE_FILES = ["--preallocate", "false"]


@dataclass(frozen=True)
class StoredMessage:
    message_id: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: dict[str, str]


def servers(cluster: ProcessCluster) -> str:
    return ",".join(cluster.addresses.values())


async def leader_of(cluster: ProcessCluster) -> str:
    async with DLedgerClient(list(cluster.addresses.values())) as client:
        return await find_leader(client, list(cluster.addresses.values()))


async def stored_messages(cluster: ProcessCluster, topic: str) -> list[StoredMessage]:
    """Every committed message of `topic`, in log order."""
    found = []
    async with DLedgerClient(list(cluster.addresses.values())) as client:
        async for entry in client.read():
            message = _decode(entry.body)
            if message is not None and message.topic == topic:
                found.append(StoredMessage(message.uniq_key or "", message.queue_id, message.queue_offset,
                                           message.body, dict(message.properties)))
    return found


def _decode(body: bytes) -> MessageExt | None:
    try:
        return codec.decode(body)
    except MessageDecodeError:
        return None  # a system entry (topic config, offsets, ...)


async def is_served(cluster: ProcessCluster, method: str) -> bool:
    """Whether the broker serves `method` yet (RPCs land from other branches)."""
    address = next(iter(cluster.addresses.values()))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = getattr(spb, f"{method}Request")()
        # wait_for_ready: a node still starting must answer, not look like "served".
        call = getattr(stub, method)(request, metadata=[("x-mq-client-id", "probe")], timeout=30,
                                     wait_for_ready=True)
        try:
            if hasattr(call, "__aiter__"):
                async for _ in call:
                    break
            else:
                await call
        except grpc.aio.AioRpcError as error:
            # grpc.aio answers a unary method the servicer lacks with UNKNOWN
            # ("Unexpected NotImplementedError"), a streaming one with UNIMPLEMENTED.
            return error.code() != grpc.StatusCode.UNIMPLEMENTED and "NotImplementedError" not in (error.details() or "")
    return True


async def require_served(cluster: ProcessCluster, *methods: str) -> None:
    """Skip the test while the broker does not serve `methods` yet."""
    for method in methods:
        if not await is_served(cluster, method):
            pytest.skip(f"the broker does not serve {method} yet")
