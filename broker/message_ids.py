"""Recently stored message ids, for send retries.

A RocketMQ 5 producer makes the message id and retries a failed send with the
same id (three attempts by default), and a send whose answer was lost in a
failover is retried at the new leader. The broker answers a repeat with the
original receipt instead of storing the message twice.

The table is derived from applied messages (an arrival listener of the apply
loop), so every replica has it and a new leader knows every message committed
before its term. It is keyed by (topic, message id): RocketMQ keeps the id on
retry, dead-letter and delivered-delay copies, which live in other topics.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from store.codec import DispatchRequest


class StoredMessage(NamedTuple):
    # Made for every message applied, on every replica: a named tuple is
    # built several times faster than a frozen dataclass.
    queue_id: int
    queue_offset: int
    physical_offset: int
    # Where it was stored: its own topic, or a timer or half-message topic
    # (the receipt of a repeat then carries the recall handle or transaction id).
    topic: str = ""


class MessageIdTable:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._table: OrderedDict[tuple[str, str], StoredMessage] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def on_arrival(self, request: DispatchRequest, index: int) -> None:
        message_id = request.uniq_key
        if message_id:
            self.remember(message_id, StoredMessage(request.queue_id, request.queue_offset,
                                                    request.physical_offset, request.topic))

    def remember(self, message_id: str, stored: StoredMessage) -> None:
        """Also called by the leader as soon as a send commits: from then until
        the apply loop reaches the message, a retry must find it here too."""
        self._table[(stored.topic, message_id)] = stored
        if len(self._table) > self.capacity:
            self._table.popitem(last=False)

    def get(self, topic: str, message_id: str) -> StoredMessage | None:
        return self._table.get((topic, message_id))
