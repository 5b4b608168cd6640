"""DLedgerCommitLog: RocketMQ's CommitLog kept as DLedger entries.

One message is one entry; its body is the message in RocketMQ's stored layout
(store/codec.py). The physical offset of a message is its entry's position +
48 (the header), so it is the same on every replica; it is written into the
message by DLedger's append hook once the leader has placed the entry.

Queue offsets are assigned here, on the leader, as each message is written:
dense per queue, in log order. A leader assigns only after its apply loop
has applied everything up to the entry that opened its term (then the
ConsumeQueues hold every committed message, and every entry after that point
in its log is its own), so what it assigns is what every replica's apply loop
derives from the committed log. The apply loop checks that, message by
message. Offsets of entries that a later leader cuts are given out again by
that leader, as in RocketMQ, because they were never committed.
"""
from __future__ import annotations

import logging
import time
import zlib
from typing import Callable, NamedTuple, Sequence

from dledger.entry import CHANNEL_STATE_MACHINE
from dledger.errors import DLedgerError, ResponseCode
from dledger.server import DLedgerServer
from store import codec
from store import message_const as mc
from store.codec import DispatchRequest, MessageExt
from store.errors import (PutOutcomeUnknownError, StoreError, StoreFullError,
                          StoreUnavailableError)
from store.hot_messages import HotMessages
from store.message_id import create_offset_message_id
from store.socket_address import SocketAddress

log = logging.getLogger(__name__)

DLEDGER_HEADER_SIZE = 48  # a message's physical offset is its entry's position + this

QueueKey = tuple[str, int]
# Messages this leader wrote and its apply loop has not reached yet, by
# entry position: (the entry's term, its body's CRC-32, what `peek` would
# find in it). See DLedgerCommitLog.written.
WrittenMessages = dict[int, tuple[int, int, DispatchRequest]]


class PutResult(NamedTuple):
    """Where a message went (RocketMQ's AppendMessageResult). A NamedTuple:
    one is made per message sent, and a frozen dataclass costs several times
    as much to make."""
    store_host: SocketAddress
    physical_offset: int
    queue_id: int
    queue_offset: int        # -1 for messages no ConsumeQueue lists (half, rollback)
    size: int
    store_timestamp: int
    index: int               # the DLedger entry index

    @property
    def message_id(self) -> str:
        """The offset message id (store host + physical offset); made on
        demand: most senders never look at it."""
        return create_offset_message_id(self.store_host, self.physical_offset)


def gets_queue_offset(sys_flag: int) -> bool:
    """RocketMQ lists plain and committed-transaction messages in ConsumeQueues;
    prepared (half) and rolled-back ones only live in the commit log."""
    return mc.transaction_type(sys_flag) in (mc.TRANSACTION_NOT_TYPE, mc.TRANSACTION_COMMIT_TYPE)


class DLedgerCommitLog:
    def __init__(self, server: DLedgerServer, store_host: SocketAddress,
                 queue_end: Callable[[str, int], int], hot_bytes: int = 0) -> None:
        """`queue_end(topic, queue_id)`: the ConsumeQueue's max offset, which is
        where a leader starts assigning for a queue it has not written yet."""
        self.server = server
        self.store_host = store_host
        self._queue_end = queue_end
        # The leader's next offset per queue, valid for `_offsets_term` only.
        self._next_offsets: dict[QueueKey, int] = {}
        self._offsets_term = -1
        # See MessageStoreConfig.legacy_untagged_entries.
        self.legacy_untagged_entries = False
        # The newest messages this leader stored, once committed (store/hot_messages.py).
        self.hot = HotMessages(hot_bytes)
        self._retained = (-2, 0)   # (the log's first index, min_physical_offset then)
        # The apply loop parses every message back from its entry to derive
        # ConsumeQueues and the index; on the leader those are messages it
        # built a moment before. So `put` leaves what parsing would find here,
        # and the apply loop (store/reput.py) takes it instead, for an entry
        # whose term and body CRC in the committed log are the ones written
        # (an entry a later leader put at the same position has another term:
        # Raft's log matching; a failed put takes its own back).
        self.written: WrittenMessages = {}

    @property
    def log(self):  # noqa: ANN201 - the DLedgerFileStore
        return self.server.store

    # ------------------------------------------------------------------ reads
    @property
    def committed_index(self) -> int:
        return self.server.member_state.committed_index

    def committed_end(self) -> int:
        """Data position just after the last committed entry (RocketMQ's
        confirm offset, minus the header): nothing at or past it is visible."""
        log_store = self.log
        committed = min(self.committed_index, log_store.ledger_end_index)
        if committed < log_store.ledger_begin_index:
            return self.min_position()
        return log_store.end_position_of(committed)

    def min_position(self) -> int:
        """Position of the first retained entry (the log's begin)."""
        log_store = self.log
        if log_store.ledger_end_index >= log_store.ledger_begin_index:
            return log_store.position_of(log_store.ledger_begin_index)
        return log_store.write_position

    def min_physical_offset(self) -> int:
        return self.min_position() + DLEDGER_HEADER_SIZE

    def read_hot(self, physical_offset: int, size: int | None = None) -> MessageExt | None:
        """The message at `physical_offset` from the hot messages, if held and
        still retained (None: read it from the log)."""
        if not self.hot.enabled or physical_offset < self._retained_from():
            return None
        return self.hot.get(physical_offset, size)

    def _retained_from(self) -> int:
        """min_physical_offset, worked out again only when retention has moved
        the log's first entry (it looked the position up on every read)."""
        begin = self.log.ledger_begin_index
        if self._retained[0] != begin:
            self._retained = (begin, self.min_physical_offset())
        return self._retained[1]

    def read(self, physical_offset: int, size: int | None = None) -> bytes | None:
        """The stored message at `physical_offset`, if committed and retained
        (`size`: the message's size when known, which saves a read)."""
        try:
            entry = self.log.get_at_position(physical_offset - DLEDGER_HEADER_SIZE,
                                             None if size is None else size + DLEDGER_HEADER_SIZE)
        except DLedgerError:
            return None
        if entry.index > self.committed_index:
            return None
        if entry.channel != CHANNEL_STATE_MACHINE and not self.legacy_untagged_entries:
            return None  # a log client's entry, whatever its bytes look like
        return entry.body

    # ------------------------------------------------------------------ writes
    async def put(self, messages: Sequence[MessageExt], ready_from: int, applied_index: int) -> list[PutResult]:
        """Write `messages` (stamped here with store time, store host and
        offsets) as consecutive entries and wait for their commit."""
        term = self.server.member_state.term
        if term != self._offsets_term:
            self._next_offsets.clear()
            self._offsets_term = term
            self.written.clear()   # an earlier term's: never applied (cut) or found stale by their term
        if applied_index < ready_from:
            raise StoreUnavailableError(f"this new leader has applied the log to {applied_index}, "
                                        f"not yet to {ready_from} where its term starts")
        now = int(time.time() * 1000)
        bodies: list[bytearray] = []
        for message in messages:
            message.store_timestamp = now
            message.store_host = self.store_host
            bodies.append(bytearray(codec.encode(message)))
        assigned: list[int] = []
        fields: list[codec.DecodedFields] = []
        before = dict(self._next_offsets)
        written_from = self.log.write_position
        written = self.written
        placed: list[tuple[int, tuple[int, int, DispatchRequest]]] = []

        def place(positions: list[int]) -> None:
            # Runs once the leader knows where the entries go, before any byte
            # is written: offsets are handed out in exactly the log's order.
            for message, body, position in zip(messages, bodies, positions):
                queue_offset = self._assign(message) if gets_queue_offset(message.sys_flag) else -1
                assigned.append(queue_offset)
                codec.patch_offsets(body, max(queue_offset, 0), position + DLEDGER_HEADER_SIZE)
                decoded = codec.decoded_fields(body, message)
                fields.append(decoded)
                mine = (term, zlib.crc32(body), codec.dispatch_request_of(decoded))
                written[position] = mine
                placed.append((position, mine))

        try:
            first, _, positions = await self.server.append(bodies, prepare=place, channel=CHANNEL_STATE_MACHINE)
        except DLedgerError as error:
            if self.log.write_position == written_from:
                self._next_offsets = before  # nothing written: the offsets are free again
            # Whatever the failed put left in the log (its outcome unknown)
            # the apply loop parses: no later entry at a position it had can
            # then be taken for its own.
            for position, mine in placed:
                if written.get(position) is mine:
                    del written[position]
            raise store_error(error) from None
        if self.hot.enabled:
            # Committed now: final, so consumers may read them from memory.
            self.hot.remember([(pos + DLEDGER_HEADER_SIZE, decoded) for pos, decoded in zip(positions, fields)])
        return [PutResult(self.store_host,
                          pos + DLEDGER_HEADER_SIZE, message.queue_id, queue_offset, len(body), now, first + i)
                for i, (message, body, pos, queue_offset)
                in enumerate(zip(messages, bodies, positions, assigned))]

    def _assign(self, message: MessageExt) -> int:
        key = (message.topic, message.queue_id)
        offset = self._next_offsets.get(key)
        if offset is None:
            offset = self._queue_end(*key)
        self._next_offsets[key] = offset + 1
        return offset


def store_error(error: DLedgerError) -> StoreError | DLedgerError:
    """Name a log failure in the store's words (the broker maps these to codes)."""
    code = error.code
    if code in (ResponseCode.NOT_LEADER, ResponseCode.LEADER_NOT_READY, ResponseCode.LEADER_TRANSFERRING,
                ResponseCode.LEADER_PENDING_FULL):
        return StoreUnavailableError(error.message, error.leader_id, error.leader_address)
    if code in (ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED):
        return PutOutcomeUnknownError(error.message)
    if code in (ResponseCode.DISK_FULL,):
        return StoreFullError(error.message)
    return error
