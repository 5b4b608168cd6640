"""Helpers for tests of broker.client against real node processes: a cluster
with its leader, and what the committed log holds (read with the DLedger
client and decoded with the store's codec, independently of the broker's
consumption RPCs)."""
from __future__ import annotations

from dataclasses import dataclass

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
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
