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

import zlib
from dataclasses import dataclass

from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

VERSION = "1"
_FIELDS = 6
_MAX_HANDLE_CHARS = 256


@dataclass(frozen=True)
class ReceiptHandle:
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
            queue_id, offset, lease, deadline_ms, check = (int(part, 16) for part in parts[1:])
        except ValueError:
            raise invalid_handle(f"{text[:64]!r} is not a receipt handle this broker issued") from None
        if check != _check(group, topic, text.rsplit(":", 1)[0]):
            raise invalid_handle(f"the receipt handle was not issued to consumer group {group!r} for topic "
                                 f"{topic!r} (or was altered)")
        return cls(queue_id, offset, lease, deadline_ms)


def _check(group: str, topic: str, body: str) -> int:
    return zlib.crc32(f"{group}\x00{topic}\x00{body}".encode("utf-8"))


def invalid_handle(reason: str) -> BrokerError:
    return BrokerError(pb.INVALID_RECEIPT_HANDLE, reason)
