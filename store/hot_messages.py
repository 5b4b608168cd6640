"""HotMessages: the leader's newest committed messages, kept decoded.

Consumers mostly read what was just written. Reading a message back costs the
leader a log read, the entry's CRC check and a full decode (a quarter of its
CPU while consumers keep up with producers: 16 receive loops taking 64 at a
time), although the leader built that very message a moment earlier. So the
send path leaves each message it stored here once the log has committed it,
and `MessageStore.read_message` looks here first, as RocketMQ and Kafka serve
tail reads from the page cache instead of the disk.

Only committed messages enter, so what is held is final: a committed entry is
never truncated and is the same at the same position on every replica, so a
physical offset names one message for the log's whole life (retention aside:
the caller checks that an offset is still retained). A message is held as the
fields `decode` would give (store/codec.py, `decoded_fields`), not as a
MessageExt: those tuples hold no object the garbage collector tracks, so a
cache of many thousands adds nothing to a full collection's walk (see
store/recent_map.py), and every hit gets a MessageExt of its own to change.

Bounded by the stored size of what it holds; the oldest go first.
"""
from __future__ import annotations

from collections import deque

from store import codec
from store.codec import DecodedFields, MessageExt


class HotMessages:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._held: dict[int, DecodedFields] = {}
        self._order: deque[tuple[int, int]] = deque()   # (physical offset, stored size), oldest first
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._held)

    def remember(self, held: list[tuple[int, DecodedFields]]) -> None:
        """Hold committed messages: (physical offset, fields), in log order."""
        store, order = self._held, self._order
        added = 0
        for physical_offset, fields in held:
            size = fields[0][0]
            store[physical_offset] = fields
            order.append((physical_offset, size))
            added += size
        self.held_bytes += added
        if self.held_bytes > self.capacity_bytes:
            self._evict()

    def _evict(self) -> None:
        store, order = self._held, self._order
        held_bytes, capacity = self.held_bytes, self.capacity_bytes
        while held_bytes > capacity and order:
            oldest, oldest_size = order.popleft()
            # A physical offset is held once: committed, it is never put again.
            del store[oldest]
            held_bytes -= oldest_size
        self.held_bytes = held_bytes

    def get(self, physical_offset: int, size: int | None = None) -> MessageExt | None:
        """A new MessageExt for the message at `physical_offset` (of stored
        size `size`, when the caller knows it), or None when not held."""
        fields = self._held.get(physical_offset)
        if fields is None or (size is not None and fields[0][0] != size):
            self.misses += 1
            return None
        self.hits += 1
        return codec.from_decoded_fields(fields)
