"""Receipt handles: what a consumer hands back to acknowledge a message, move
its deadline or send it to the dead-letter queue.

A handle names one lease on one message:

    1:<queue id>:<queue offset>:<lease>:<deadline ms>:<check>      (numbers in hex)

`lease` is the index of the log entry that granted the lease (the receive
that delivered the message, or the ChangeInvisibleDuration that renewed it),
so it is the same on every replica and a new leader recognises handles the old
one gave out. `check` is a CRC-32 over the consumer group, the topic and the
rest of the handle: a handle presented for another group or topic, or mangled
in transit, is refused. It is a consistency check, not a signature (RocketMQ's
handles are not signed either).

Whether the lease is still current is not the handle's business: that is the
replicated pop state's (broker/consumer/pop_state.py).
"""
from __future__ import annotations

import functools
import zlib
from typing import NamedTuple

from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

VERSION = "1"
_FIELDS = 6
_MAX_HANDLE_CHARS = 256


class ReceiptHandle(NamedTuple):
    # A NamedTuple: one is made per message received and per entry acked.
    queue_id: int
    offset: int
    lease: int
    deadline_ms: int

    def encode(self, group: str, topic: str) -> str:
        body = f"{VERSION}:{self.queue_id:x}:{self.offset:x}:{self.lease:x}:{self.deadline_ms:x}"
        return f"{body}:{_check(group, topic, body):08x}"

    @classmethod
    def decode(cls, text: str, group: str, topic: str) -> ReceiptHandle:
        """The handle in `text`, which must have been issued to `group` for
        `topic`; INVALID_RECEIPT_HANDLE otherwise."""
        if not text:
            raise invalid_handle("the receipt handle is empty")
        parts = text.split(":") if len(text) <= _MAX_HANDLE_CHARS else []
        if len(parts) != _FIELDS or parts[0] != VERSION:
            raise invalid_handle(f"{text[:64]!r} is not a receipt handle this broker issued")
        try:
            # One by one, not in a generator: this runs for every entry of
            # every ack.
            queue_id, offset, lease = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
            deadline_ms, check = int(parts[4], 16), int(parts[5], 16)
        except ValueError:
            raise invalid_handle(f"{text[:64]!r} is not a receipt handle this broker issued") from None
        if check != _check(group, topic, text.rpartition(":")[0]):
            raise invalid_handle(f"the receipt handle was not issued to consumer group {group!r} for topic "
                                 f"{topic!r} (or was altered)")
        return cls(queue_id, offset, lease, deadline_ms)


def _check(group: str, topic: str, body: str) -> int:
    # The CRC of group, topic and body, continued from the group and topic's
    # (the same value as one CRC over the three, as handles always had).
    return zlib.crc32(body.encode("utf-8"), _names_crc(group, topic))


@functools.lru_cache(maxsize=4096)
def _names_crc(group: str, topic: str) -> int:
    return zlib.crc32(f"{group}\x00{topic}\x00".encode("utf-8"))


def invalid_handle(reason: str) -> BrokerError:
    return BrokerError(pb.INVALID_RECEIPT_HANDLE, reason)
