"""ReputMessageService: the one task that derives the store from the committed log.

It reads committed entries in index order and dispatches each:
- a message: its ConsumeQueue unit (plain and committed-transaction messages,
  as RocketMQ's CommitLogDispatcherBuildConsumeQueue), its IndexFile items,
  then the arrival listeners (long polling, the delayed-message service, ...);
- a system entry: to the manager registered for its kind (topics, groups,
  consumer offsets; the broker registers its own kinds);
- the log's own entries (term NOOPs, producer marks) and entries a log
  client appended (`dledger append` data on the same log): nothing.

Only entries the store wrote itself are applied: the leader's write path sets
the channel field of their DLedger header (CHANNEL_STATE_MACHINE), which the
Append RPC cannot set and the chain CRC covers. So a log client can neither
forge a system entry (delete a topic, ack someone's lease, decide a
transaction) nor stop the loop with a body shaped like a message: its
entries are counted (`raw_entries`) and skipped, whatever their bytes.

Everything it writes is derived from committed entries only, so every replica
derives the same ConsumeQueues, index and metadata. It checks the leader's
work as it goes: a message must sit at its entry's position + 48 and carry
exactly the next offset of its queue; if not, applying stops (StoreFailedError)
rather than derive a store that differs from the other replicas'.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from dledger.checked_read import CheckedReader
from dledger.entry import CHANNEL_STATE_MACHINE, HEADER, HEADER_SIZE, MAGIC_NORMAL
from dledger.server import DLedgerServer
from dledger.waiting import wait_event
from store import codec
from store.codec import DispatchRequest
from store.commit_log import DLEDGER_HEADER_SIZE, WrittenMessages, gets_queue_offset
from store.consume_queue import ConsumeQueue
from store.consume_queue_store import ConsumeQueueStore
from store.errors import StoreError, StoreFailedError
from store.index_service import IndexedMessage, IndexService
from store.system_entry import SYSTEM_MAGIC_CODE, decode_system_entry

log = logging.getLogger(__name__)

DISK_RETRY_S = 1.0
REFETCH_WAIT_S = 0.05

# The loop yields to other tasks after this much time or this many entries,
# so that a long catch-up (a restart, a new follower) or a burst of messages
# that each cost the apply loop much (delayed messages: a timer each) does not
# starve the node's RPCs. A slice of 2,000 entries took 100-170 ms of CPU with
# 120,000 timers arriving, 250-750 ms of wall time when the process waited
# for a core: a leader's heartbeats went out that late and followers elected
# another (tests/integration/test_big_state.py under load). Runs are read at
# most RUN_ENTRIES at a time so that the budget is checked often.
SLICE_BUDGET_S = 0.01
ENTRIES_PER_SLICE = 2000
RUN_ENTRIES = 256

ArrivalListener = Callable[[DispatchRequest, int], None]  # (message, entry index)


class SystemEntryHandler(Protocol):
    kinds: frozenset[int]

    def apply(self, index: int, kind: int, payload: dict) -> None: ...


@dataclass
class _UnitBatch:
    """Consecutive ConsumeQueue units of one queue waiting to be written."""
    queue: ConsumeQueue
    first_offset: int
    units: list[tuple[int, int, int]]

    @property
    def next_offset(self) -> int:
        return self.first_offset + len(self.units)


@dataclass
class Progress:
    """Where applying stands: the last applied entry and the store time of the
    last applied message (the checkpoint records both)."""
    applied_index: int
    last_store_timestamp: int = 0
    # Where the last applied entry ends in the log: the ConsumeQueues hold
    # units up to here, even while a log cut for repair ends before it.
    applied_end: int = 0


class ReputMessageService:
    def __init__(self, server: DLedgerServer, consume_queues: ConsumeQueueStore, index: IndexService | None,
                 min_physical_offset: Callable[[], int], applied_index: int, batch_bytes: int,
                 legacy_untagged_entries: bool = False, written: WrittenMessages | None = None) -> None:
        """`written`: the commit log's messages put but not yet applied
        (DLedgerCommitLog.written), taken instead of parsing their entries."""
        self.server = server
        self.written: WrittenMessages = {} if written is None else written
        self.consume_queues = consume_queues
        self.index = index
        self.min_physical_offset = min_physical_offset
        self.progress = Progress(applied_index)
        # The last entry dispatched; ahead of progress.applied_index while the
        # ConsumeQueue units and index items it derived wait to be written
        # (a full disk: the loop retries the writes, never the entries).
        self._dispatched = applied_index
        self.waiting_for_disk = ""
        self.batch_bytes = batch_bytes
        # Every entry is checked before it is applied (dledger/checked_read.py).
        self.reader = CheckedReader(server)
        self.handlers: dict[int, SystemEntryHandler] = {}
        self.listeners: list[ArrivalListener] = []
        self.failure: StoreFailedError | None = None
        self._units: dict[tuple[str, int], _UnitBatch] = {}
        self._indexing: list[IndexedMessage] = []  # the current run's, written with its units
        self._applied_event = asyncio.Event()
        self.raw_entries = 0   # entries of log clients, skipped
        # Logs from before the channel: untagged NORMAL entries are applied
        # when their body looks like a store entry, skipped when it does not decode.
        self.legacy_untagged_entries = legacy_untagged_entries
        # Called with the log's new first index when entries this loop never
        # applied are gone (a follower reset to its leader's first entry).
        self.gap_listeners: list[Callable[[int], None]] = []

    @property
    def applied_index(self) -> int:
        return self.progress.applied_index

    @property
    def dispatched_index(self) -> int:
        """The last entry the handlers have applied (ahead of applied_index
        only while derived files wait for disk space)."""
        return self._dispatched

    def register(self, handler: SystemEntryHandler) -> None:
        for kind in handler.kinds:
            self.handlers[kind] = handler

    # ------------------------------------------------------------------- loop
    async def run(self) -> None:
        try:
            while True:
                committed = self.server.member_state.committed_index
                if self.applied_index >= committed:
                    await self.server.wait_committed(self.applied_index + 1)
                    continue
                if self._dispatched >= self.server.store.ledger_end_index:
                    # Committed but not here: a log cut for repair is being
                    # fetched again from the leader.
                    await asyncio.sleep(REFETCH_WAIT_S)
                    continue
                try:
                    self.apply_available(committed)
                except OSError as error:
                    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    await self._wait_for_disk(error)
                    continue
                if self.waiting_for_disk:
                    log.info("the apply loop goes on: the disk has room again")
                    self.waiting_for_disk = ""
                if self.applied_index < self.server.member_state.committed_index:
                    # More to apply: let the node's other work have a turn
                    # first. (Caught up, the wait above yields: a turn here as
                    # well cost one per commit for nothing.)
                    await asyncio.sleep(0)
        except StoreFailedError as failure:
            self.failure = failure
            log.critical("the apply loop stopped: %s", failure)
            self._applied_event.set()

    async def _wait_for_disk(self, error: OSError) -> None:
        """A write of derived files failed for want of space: what was
        dispatched stays dispatched, its units and index items stay pending,
        and the loop tries again in a second (the node's reads go on)."""
        if not self.waiting_for_disk:
            log.warning("the apply loop waits after entry %d: %s", self._dispatched, error)
        self.waiting_for_disk = str(error)
        await asyncio.sleep(DISK_RETRY_S)

    def apply_available(self, committed: int) -> None:
        """Apply committed entries after applied_index, up to `committed`, in
        slices; a slice at a time from the caller's point of view."""
        log_store = self.server.store
        self._write_derived()  # what a failed write left pending
        if self._dispatched > self.applied_index:
            self.progress.applied_index = self._dispatched
        start = max(self._dispatched + 1, log_store.ledger_begin_index)
        if start > self._dispatched + 1:
            self._dispatched = start - 1
            for listener in self.gap_listeners:
                listener(start)
        applied = 0
        deadline = time.monotonic() + SLICE_BUDGET_S
        while start <= committed and applied < ENTRIES_PER_SLICE and time.monotonic() < deadline:
            # The raw bytes, walked by header; the loop decodes only what it
            # dispatches, not every entry in full.
            run = self.reader.read(start, self.batch_bytes, min(committed - start + 1, RUN_ENTRIES))
            if run.count:
                self._dispatch_run(memoryview(run.data), run.count)
                start += run.count
                applied += run.count
                self.progress.applied_index = start - 1
                self.progress.applied_end = log_store.end_position_of(start - 1)
            if run.damaged is not None or run.count == 0:
                break   # a damaged entry is being repaired: the loop resumes when it is back
        if start > self.applied_index + 1:
            self.progress.applied_index = start - 1
        self._applied_event.set()
        self._applied_event = asyncio.Event()

    async def wait_applied(self, index: int, timeout: float) -> bool:
        """Wait until entries up to `index` are applied; False on timeout or failure."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.applied_index < index and self.failure is None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            if not await wait_event(self._applied_event, remaining):
                return False
        return self.applied_index >= index

    # --------------------------------------------------------------- dispatch
    def _dispatch_run(self, data: memoryview, count: int) -> None:
        """Dispatch `count` back-to-back encoded entries. ConsumeQueue units
        collect per queue and go to their files once per run (one write per
        queue, not per message)."""
        at = 0
        unpack = HEADER.unpack_from
        legacy = self.legacy_untagged_entries
        written = self.written
        try:
            for _ in range(count):
                magic, size, index, term, pos, channel, _, body_crc, _ = unpack(data, at)
                if index <= self._dispatched:
                    at += size  # dispatched before its derived writes failed
                    continue
                if magic == MAGIC_NORMAL:
                    if channel == CHANNEL_STATE_MACHINE:
                        mine = written.pop(pos, None) if written else None
                        self._dispatch(index, pos, data[at + HEADER_SIZE:at + size],
                                       mine[2] if mine is not None and mine[0] == term and mine[1] == body_crc
                                       else None)
                    elif legacy:
                        self._dispatch_untagged(index, pos, data[at + HEADER_SIZE:at + size])
                    else:
                        self._note_raw(index)
                self._dispatched = index
                at += size
        finally:
            self._write_derived()

    def _dispatch(self, index: int, pos: int, body: memoryview, written: DispatchRequest | None = None) -> None:
        """`written`: what this leader's put left for the entry (the message
        it wrote there, in this very entry: same position, term and body
        CRC), so that the entry need not be parsed back."""
        try:
            if written is not None:
                self._dispatch_request(index, pos, written)
                return
            magic = codec.peek_magic(body) if len(body) >= 8 else 0
            if magic in codec.MESSAGE_MAGIC_CODES:
                self._dispatch_message(index, pos, body)
            elif magic == SYSTEM_MAGIC_CODE:
                self._write_derived()  # a handler sees the store as of this entry
                self._dispatch_system(index, body)
            else:
                self._note_raw(index)
        except StoreFailedError:
            raise
        except StoreError as error:
            raise StoreFailedError(f"entry {index} (pos {pos}) cannot be applied: {error}") from error

    def _dispatch_untagged(self, index: int, pos: int, body: memoryview) -> None:
        """legacy_untagged_entries: an entry that may be the store's or a log
        client's. One that does not decode is a client's: skipped, never a
        stopped loop."""
        try:
            self._dispatch(index, pos, body)
        except Exception as error:  # noqa: BLE001 - any client bytes, any failure
            log.warning("entry %d: untagged entry skipped, it does not apply: %s", index, error)
            self._note_raw(index)

    def _dispatch_message(self, index: int, pos: int, body: memoryview) -> None:
        self._dispatch_request(index, pos, codec.peek(body))

    def _dispatch_request(self, index: int, pos: int, request: DispatchRequest) -> None:
        if request.physical_offset != pos + DLEDGER_HEADER_SIZE:
            raise StoreFailedError(f"entry {index}: message says physical offset "
                                   f"{request.physical_offset}, but it lies at {pos + DLEDGER_HEADER_SIZE}")
        if gets_queue_offset(request.sys_flag):
            self._put_unit(index, request)
        if self.index is not None:
            self._indexing.append((request.topic, request.keys, request.uniq_key, request.physical_offset,
                                   request.store_timestamp, request.sys_flag))
        self.progress.last_store_timestamp = request.store_timestamp
        for listener in self.listeners:
            listener(request, index)

    def _put_unit(self, index: int, request: DispatchRequest) -> None:
        unit = (request.physical_offset, request.msg_size, request.tags_code)
        batch = self._units.get((request.topic, request.queue_id))
        if batch is not None:
            if request.queue_offset == batch.next_offset:
                batch.units.append(unit)
                return
            self._write_units()  # not the next offset: the queue's own checks decide
        queue = self._queue_for(index, request)
        self._units[(request.topic, request.queue_id)] = _UnitBatch(queue, request.queue_offset, [unit])

    def _queue_for(self, index: int, request: DispatchRequest) -> ConsumeQueue:
        """The queue a unit at request.queue_offset goes to, checked (or
        restarted, for a log that begins mid-queue)."""
        queue = self.consume_queues.find_or_create(request.topic, request.queue_id)
        if request.queue_offset > queue.max_offset and self._starts_afresh(queue):
            # This replica's log begins after the queue's earlier messages
            # (retention, or a reset to the leader's first entry).
            log.info("ConsumeQueue %s/%d starts at offset %d", request.topic, request.queue_id,
                     request.queue_offset)
            queue.restart_at(request.queue_offset)
        if request.queue_offset < queue.min_offset:
            raise StoreFailedError(f"entry {index}: {request.topic}/{request.queue_id} offset "
                                   f"{request.queue_offset} is below the queue's minimum {queue.min_offset}")
        if request.queue_offset > queue.max_offset:
            raise StoreFailedError(f"entry {index}: {request.topic}/{request.queue_id} offset "
                                   f"{request.queue_offset} would leave a gap after {queue.max_offset - 1}")
        return queue

    def _write_derived(self) -> None:
        """Write what the messages dispatched so far derived: index items and
        ConsumeQueue units."""
        self._write_index()
        self._write_units()

    def _write_index(self) -> None:
        if not self._indexing:
            return
        indexing, self._indexing = self._indexing, []
        assert self.index is not None
        try:
            self.index.put_messages(indexing)
        except OSError:
            self._indexing = indexing + self._indexing  # tried again when the disk has room
            raise
        except (StoreError, ValueError) as error:
            raise StoreFailedError(f"indexing messages at offsets {indexing[0][3]}..{indexing[-1][3]}: "
                                   f"{error}") from error

    def _write_units(self) -> None:
        """Write the collected units: at max_offset they append; below it, a
        replay after a restart must find exactly them there."""
        batches, self._units = self._units, {}
        for (topic, queue_id), batch in batches.items():
            try:
                batch.queue.put_batch(batch.first_offset, batch.units)
            except OSError:
                # This batch and the ones after it are tried again (a put
                # below the queue's end checks and skips what was written).
                pending = list(batches)
                self._units = {key: batches[key] for key in pending[pending.index((topic, queue_id)):]}
                raise
            except StoreError as error:
                raise StoreFailedError(f"{topic}/{queue_id} at offset {batch.first_offset}: {error}") from error

    def _starts_afresh(self, queue: ConsumeQueue) -> bool:
        last = queue.last_unit()
        return last is None or last.phys_offset < self.min_physical_offset()

    def _dispatch_system(self, index: int, body: memoryview) -> None:
        system = decode_system_entry(body)
        handler = self.handlers.get(system.kind)
        if handler is None:
            log.warning("entry %d: no handler for system entry kind %d; skipped", index, system.kind)
            return
        handler.apply(index, system.kind, system.payload)

    def replay(self, first: int, last: int, handlers: Sequence[SystemEntryHandler]) -> bool:
        """Apply the system entries first..last of the handlers' kinds to
        them again (a manager that adopted a metadata snapshot as of first-1;
        see store/metadata_snapshot.py). Entries that applied once apply again,
        so a failure to apply one is a bug: logged, never a stopped loop.
        False when a damaged entry ended the replay early: it is being
        repaired, and the handlers lack what followed it."""
        log_store = self.server.store
        if first < log_store.ledger_begin_index:
            # Retention keeps every entry after the latest snapshot's asOf;
            # what it may have taken here held nothing for these handlers.
            log.warning("entries %d..%d are no longer in the log: applying again from %d", first,
                        log_store.ledger_begin_index - 1, log_store.ledger_begin_index)
            first = log_store.ledger_begin_index
        reader = CheckedReader(self.server)
        start = first
        while start <= last:
            run = reader.read(start, self.batch_bytes, last - start + 1)
            self._replay_run(memoryview(run.data), run.count, handlers)
            start += run.count
            if run.damaged is not None:
                return False
            if run.count == 0:
                break
        return True

    def _replay_run(self, data: memoryview, count: int, handlers: Sequence[SystemEntryHandler]) -> None:
        at = 0
        unpack = HEADER.unpack_from
        for _ in range(count):
            magic, size, index, _, _, channel, _, _, _ = unpack(data, at)
            body = data[at + HEADER_SIZE:at + size]
            at += size
            ours = channel == CHANNEL_STATE_MACHINE or self.legacy_untagged_entries
            if magic != MAGIC_NORMAL or not ours or len(body) < 8 or codec.peek_magic(body) != SYSTEM_MAGIC_CODE:
                continue
            try:
                system = decode_system_entry(body)
                for handler in handlers:
                    if system.kind in handler.kinds:
                        handler.apply(index, system.kind, system.payload)
            except Exception as error:  # noqa: BLE001 - see replay
                log.error("entry %d: applying it again after a metadata snapshot failed: %s", index, error)

    def _note_raw(self, index: int) -> None:
        self.raw_entries += 1
        if self.raw_entries in (1, 10, 100, 1000) or self.raw_entries % 100_000 == 0:
            log.info("entry %d was appended by a log client, not the message store: skipped (%d such "
                     "so far)", index, self.raw_entries)

