"""Recently stored message ids, for send retries.

A RocketMQ 5 producer makes the message id and retries a failed send with the
same id (three attempts by default), and a send whose answer was lost in a
failover is retried at the new leader. The broker answers a repeat with the
original receipt instead of storing the message twice.

The table holds the ids of the messages in the last `window` entries of the
committed log, as of the entry last applied: a function of the log alone, so
every replica holds the same one and a new leader knows every message
committed in that window before its term. It is derived from applied
messages (an arrival listener of the apply loop), and at start it is rebuilt
from the log for the window before the entry the store resumes after (the
apply loop replays only what follows it). It is keyed by (topic, message
id): RocketMQ keeps the id on retry, dead-letter and delivered-delay copies,
which live in other topics.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterator, NamedTuple

from dledger.checked_read import CheckedReader
from dledger.entry import CHANNEL_STATE_MACHINE, HEADER, HEADER_SIZE, MAGIC_NORMAL
from dledger.server import DLedgerServer
from store import codec
from store.codec import DispatchRequest
from store.commit_log import DLEDGER_HEADER_SIZE
from store.errors import MessageDecodeError
from store.recent_map import RecentMap

log = logging.getLogger(__name__)

# Entries read between yields to the event loop while rebuilding.
REBUILD_SLICE = 2000


class StoredMessage(NamedTuple):
    # Made for every message applied, on every replica: a named tuple is
    # built several times faster than a frozen dataclass.
    queue_id: int
    queue_offset: int
    physical_offset: int
    # Where it was stored: its own topic, or a timer or half-message topic
    # (the receipt of a repeat then carries the recall handle or transaction id).
    topic: str = ""


Key = tuple[str, str]  # (topic, message id)
# (entry index, queue id, queue offset, physical offset, topic): a plain
# tuple of ints and a str, which the garbage collector stops tracking the
# first time it sees it (the key too: two strs).
Row = tuple[int, int, int, int, str]
# The table is a RecentMap (store/recent_map.py) positioned by entry index:
# a few plain dicts, not one OrderedDict, so that full garbage collections do
# not walk it (a leader's heartbeats waited for them:
# tests/integration/test_big_state.py).


def _stored(row: Row) -> StoredMessage:
    return StoredMessage(row[1], row[2], row[3], row[4])


class MessageIdTable:
    def __init__(self, window: int) -> None:
        self.window = window
        # Applied messages by entry index. It may hold a little more than the
        # window: a lookup checks the row's index against it.
        self._ids: RecentMap[Key, Row] = RecentMap(window)
        # The leader's: committed sends its apply loop has not reached yet.
        self._committed: dict[Key, StoredMessage] = {}
        # While the rebuild runs: what it has read so far (older than the rest).
        self._older: dict[Key, Row] = {}
        self.rebuilt = asyncio.Event()

    def rows(self) -> Iterator[tuple[Key, Row]]:
        """The ids in the window, oldest first."""
        oldest = self._ids.latest - self.window
        newest = {key: row for key, row in self._ids.items() if row[0] > oldest}
        return iter(sorted(newest.items(), key=lambda item: item[1][0]))

    def on_arrival(self, request: DispatchRequest, index: int) -> None:
        message_id = request.uniq_key
        if message_id:
            key = (request.topic, message_id)
            self._committed.pop(key, None)
            self._ids.put(key, (index, request.queue_id, request.queue_offset, request.physical_offset,
                                request.topic), index)

    def _find(self, key: Key) -> Row | None:
        row = self._ids.get(key)
        return row if row is not None and row[0] > self._ids.latest - self.window else None

    def remember(self, message_id: str, stored: StoredMessage) -> None:
        """Called by the leader as soon as a send commits: from then until
        the apply loop reaches the message, a retry must find it here too."""
        key = (stored.topic, message_id)
        if self._find(key) is None:
            self._committed[key] = stored
            if len(self._committed) > self.window:
                self._committed.pop(next(iter(self._committed)))

    def get(self, topic: str, message_id: str) -> StoredMessage | None:
        key = (topic, message_id)
        found = self._committed.get(key)
        if found is not None:
            return found
        known = self._find(key) or self._older.get(key)
        return _stored(known) if known is not None else None

    # -------------------------------------------------------------- rebuild
    async def rebuild(self, server: DLedgerServer, upto: int, batch_bytes: int, untagged: bool = False) -> int:
        """Read the messages of the window of entries up to `upto` (the
        entry the apply loop resumed after) from the log, yielding to the
        loop between slices, and put them before what was applied since.
        Returns how many were read."""
        try:
            older: dict[Key, Row] = {}
            self._older = older
            # Each entry checked first: one damaged on disk is repaired from
            # the leader and waited for (dledger/checked_read.py), never read
            # as a message id that could make a new send look repeated.
            reader = CheckedReader(server)
            start = max(upto - self.window + 1, server.store.ledger_begin_index, 0)
            while start <= upto:
                data, count = await reader.read_repaired(start, batch_bytes, min(upto - start + 1, REBUILD_SLICE))
                if count == 0:
                    break
                for index, request in _messages(memoryview(data), count, untagged):
                    if request.uniq_key:
                        key = (request.topic, request.uniq_key)
                        older[key] = (index, request.queue_id, request.queue_offset,
                                      request.physical_offset, request.topic)
                start += count
                await asyncio.sleep(0)
            self._merge(older)
            log.info("message id table rebuilt from entries up to %d: %d ids", upto, len(older))
            return len(older)
        finally:
            self._older = {}
            self.rebuilt.set()

    def _merge(self, older: dict[Key, Row]) -> None:
        """The rebuilt ids become the oldest slice: all of them lie before
        the entries applied since the start."""
        if older:
            indexes = [row[0] for row in older.values()]
            self._ids.prepend(min(indexes), older, max(indexes))


def _messages(data: memoryview, count: int, untagged: bool) -> Iterator[tuple[int, DispatchRequest]]:
    """The messages among `count` encoded entries, as the apply loop tells
    them (store/reput.py): entries the store wrote (the channel of their
    header), or with `untagged` (legacy_untagged_entries) any that decode,
    whose message lies at the entry's position + 48. A log client's append
    is never one: it could otherwise make a producer's send look repeated."""
    at = 0
    for _ in range(count):
        magic, size, index, _, pos, channel, _, _, body_size = HEADER.unpack_from(data, at)
        body = data[at + HEADER_SIZE:at + size]
        at += size
        if magic != MAGIC_NORMAL or body_size < 8 or (channel != CHANNEL_STATE_MACHINE and not untagged):
            continue
        try:
            if codec.peek_magic(body) not in codec.MESSAGE_MAGIC_CODES:
                continue
            request = codec.peek(body)
        except MessageDecodeError:
            continue
        if request.physical_offset == pos + DLEDGER_HEADER_SIZE:
            yield index, request
