"""MessageStore: RocketMQ's DefaultMessageStore over the DLedger commit log.

It owns the store directory of a node:

    <node dir>/store/consumequeue/<topic>/<queueId>/<20-digit offset>
    <node dir>/store/index/<yyyyMMddHHmmssSSS>
    <node dir>/store/config/topics.json, subscriptionGroup.json, consumerOffset.json (+ .bak)
    <node dir>/store/checkpoint, abort

and the tasks that keep it: the apply loop (ReputMessageService), a flush
task that makes derived files durable and then records in the checkpoint how
far they go, a task that rewrites the JSON snapshots, and cleanup below the
log's first retained entry. Writes (messages and metadata) go through the
leader's log; everything else is read from what the apply loop derived.

Recovery, after a clean stop or a crash alike: ConsumeQueues and index files
are cut back to the committed log, and the apply loop resumes after the
checkpoint's entry, so a restart re-derives only the unflushed tail.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from dledger.server import DLedgerServer
from dledger.tasks import start_task
from store import codec
from store.codec import MessageExt
from dledger.entry import CHANNEL_STATE_MACHINE
from dledger.errors import DLedgerError
from store.commit_log import DLEDGER_HEADER_SIZE, DLedgerCommitLog, PutResult, store_error
from store.config import MessageStoreConfig
from store.config_manager import ConfigManager
from store.consume_queue import GetStatus
from store.consume_queue_store import ConsumeQueueStore
from store.consumer_offset import ConsumerOffsetManager, OffsetCommit, offsets_payload
from store.errors import (MessageDecodeError, MessageTooLargeError, PutOutcomeUnknownError, QueueIdError,
                          StoreError, StoreFailedError, StoreStartError, StoreUnavailableError,
                          TopicNotFoundError)
from store.index_service import IndexService
from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload, encode_snapshot
from store.message_id import decode_offset_message_id
from store.reput import ArrivalListener, ReputMessageService, SystemEntryHandler
from store.socket_address import SocketAddress
from store.store_checkpoint import (ENTRY_FORMAT_CHANNEL, ENTRY_FORMAT_UNTAGGED, StoreCheckpoint, mark_running,
                                    mark_stopped)
from store.subscription_group import (SubscriptionGroupConfig, SubscriptionGroupManager, group_delete_payload,
                                      group_update_payload)
from store.system_entry import SystemKind, encode_system_entry
from store.topic_config import TopicConfig, TopicConfigManager, topic_delete_payload, topic_update_payload

log = logging.getLogger(__name__)

# A pull returns at most this many bytes of messages (RocketMQ:
# maxTransferBytesOnMessageInMemory 256 KiB; we allow a 4 MiB message through).
DEFAULT_MAX_PULL_BYTES = 4 << 20
READY_POLL_S = 0.005
# How often the leader checks whether a metadata snapshot is due.
SNAPSHOT_CHECK_S = 1.0


async def _in_thread(function: Any, *args: Any) -> None:
    """Run file work in a thread; when the caller is cancelled (shutdown
    stopping a periodic flush), wait for the thread before giving up its lock,
    or the final flush would write the same temp files at the same time."""
    work = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        await work
        raise


@dataclass
class GetMessageResult:
    """RocketMQ's GetMessageResult: what a pull found and where to go next."""
    status: GetStatus
    messages: list[MessageExt] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0


class MessageStore:
    def __init__(self, config: MessageStoreConfig, server: DLedgerServer, store_host: SocketAddress) -> None:
        self.config = config
        self.server = server
        self.topics = TopicConfigManager(config.config_dir)
        self.groups = SubscriptionGroupManager(config.config_dir)
        self.offsets = ConsumerOffsetManager(config.config_dir)
        self.managers: list[ConfigManager] = [self.topics, self.groups, self.offsets]
        self.commit_log = DLedgerCommitLog(server, store_host, self._queue_end, config.hot_message_bytes)
        self.commit_log.legacy_untagged_entries = config.legacy_untagged_entries
        self.consume_queues: ConsumeQueueStore | None = None
        self.index: IndexService | None = None
        self.reput: ReputMessageService | None = None
        self.checkpoint = StoreCheckpoint()
        self._checkpoint_path = os.path.join(config.store_dir, "checkpoint")
        self._abort_path = os.path.join(config.store_dir, "abort")
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_lock = asyncio.Lock()
        self.snapshots = MetadataSnapshotHandler(self.managers)
        self._persist_lock = asyncio.Lock()
        self._extra_handlers: list[SystemEntryHandler] = []
        self._extra_listeners: list[ArrivalListener] = []
        # The applied index the managers' files last covered together: the
        # checkpoint never claims more, so a restart replays whatever the
        # files lack (they are rewritten less often than the checkpoint).
        self._configs_cover = -1
        self.started = False

    # ============================================================== lifecycle
    def add_manager(self, manager: ConfigManager) -> None:
        """A state machine of the broker's that is fed its kinds of system
        entries and snapshotted like topics.json (see ConfigManager). Add it
        before start(): it is loaded from its file and replayed with the rest."""
        if self.started:
            raise RuntimeError("add managers before the store starts: they must be replayed from its checkpoint")
        self.managers.append(manager)

    def register_handler(self, handler: SystemEntryHandler) -> None:
        """A state machine of the broker's fed with its kinds of system entries."""
        self._extra_handlers.append(handler)
        if self.reput is not None:
            self.reput.register(handler)

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        self._extra_listeners.append(listener)
        if self.reput is not None:
            self.reput.listeners.append(listener)

    async def start(self) -> None:
        config = self.config
        os.makedirs(config.config_dir, exist_ok=True)
        crashed = mark_running(self._abort_path)
        for manager in self.managers:
            manager.load()
        self.checkpoint = StoreCheckpoint.load(self._checkpoint_path) or StoreCheckpoint()
        self._check_entry_format(self.checkpoint)
        # A log cut for repair (a damaged entry) lacks committed entries this
        # store has already applied; they come back from the leader exactly as
        # they were. So the store keeps what it derived from them (and its
        # files, which hold it) and goes on after its checkpoint once they
        # are back, rather than apply them a second time on top of the files.
        repairing = self.server.member_state.repairing and self.checkpoint.applied_index > self.commit_log.committed_index
        committed_end = self.checkpoint.confirm_phy_offset if repairing else self.commit_log.committed_end()
        min_physical = self.commit_log.min_physical_offset()
        queues = ConsumeQueueStore.open(config.store_dir, config.consume_queue_units_per_file, min_physical)
        dropped = queues.truncate_from_phys(committed_end + DLEDGER_HEADER_SIZE)
        self.consume_queues = queues
        if config.message_index_enable:
            self.index = IndexService.open(config.store_dir, config.index_hash_slots, config.index_items,
                                           committed_end=committed_end + DLEDGER_HEADER_SIZE)
        log_store = self.server.store
        known = (self.checkpoint.applied_index if repairing
                 else min(self.checkpoint.applied_index, self.commit_log.committed_index))
        resume = max(known, log_store.ledger_begin_index - 1)
        self.reput = ReputMessageService(self.server, queues, self.index, self.commit_log.min_physical_offset,
                                         resume, config.reput_batch_bytes, config.legacy_untagged_entries,
                                         written=self.commit_log.written)
        self.snapshots.start(resume, log_lost_entries=resume > known)
        self.snapshots.replay = self.reput.replay
        self.reput.gap_listeners.append(self.snapshots.on_gap)
        self._configs_cover = resume
        for handler in [*self.managers, self.snapshots, *self._extra_handlers]:
            self.reput.register(handler)
        self.reput.listeners.extend(self._extra_listeners)
        # The log keeps what the store has not durably derived yet, and the
        # latest metadata snapshot (while there is metadata but no snapshot
        # of it yet, nothing may go).
        self.server.retention_floors.append(lambda: self.checkpoint.applied_index + 1)
        self.server.retention_floors.append(self._snapshot_floor)
        # A store whose apply loop stopped answers every client with an error:
        # its node leaves leading to one whose store works.
        self.server.leadership_vetoes.append(self._stopped_reason)
        log.info("message store %s: %s, %d ConsumeQueues (%d units past the committed log dropped), "
                 "applying from entry %d (committed %d)", config.store_dir,
                 "recovering after a crash" if crashed else "clean start", len(queues), dropped,
                 resume + 1, self.commit_log.committed_index)
        self._tasks = [
            start_task(self.reput.run(), "ReputMessageService"),
            start_task(self._every(config.flush_interval_s, self.flush), "FlushConsumeQueue"),
            start_task(self._every(config.config_persist_interval_s, self.persist_configs), "PersistConfigs"),
            start_task(self._every(config.clean_interval_s, self.clean_expired), "CleanConsumeQueue"),
            start_task(self._every(SNAPSHOT_CHECK_S, self._maybe_snapshot_metadata), "MetadataSnapshot")]
        self.started = True

    async def shutdown(self) -> None:
        if not self.started:
            return
        self.started = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Configs first: the checkpoint written next may then cover everything applied.
        await self.persist_configs(force=True)
        await self.flush()
        assert self.consume_queues is not None
        self.consume_queues.close()
        if self.index is not None:
            self.index.close()
        mark_stopped(self._abort_path)
        log.info("message store stopped at entry %d", self.checkpoint.applied_index)

    @staticmethod
    async def _every(interval: float, action: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await action()
            except OSError as error:
                log.error("%s failed: %s; retrying in %.1f s", action.__name__, error, interval)

    # ======================================================== durability tasks
    async def flush(self) -> None:
        """Make derived files durable, then record how far they go. One at a
        time: the periodic flush and the one at shutdown must not interleave."""
        async with self._flush_lock:
            await self._flush_once()

    def _stopped_reason(self) -> str:
        failure = self.reput.failure if self.reput is not None else None
        return f"the message store stopped: {failure}" if failure is not None else ""

    async def _flush_once(self) -> None:
        reput, queues = self._require_started()
        progress = reput.progress
        # A restart resumes after the checkpoint's entry, and the managers
        # resume from their files: the checkpoint must not pass what the
        # files hold, or entries between the two would never reach them.
        applied, timestamp = min(progress.applied_index, self._configs_cover), progress.last_store_timestamp
        # How far the ConsumeQueues may hold units at a restart. A log cut for
        # repair ends below entries this store has applied; they come back
        # as they were, at the same positions, so the bound stays where the
        # applied entries reach (else a restart would drop their units while
        # resuming after them, and the next message would leave a gap).
        confirm = max(self.commit_log.committed_end(), progress.applied_end, self.checkpoint.confirm_phy_offset) \
            if self.server.member_state.repairing else self.commit_log.committed_end()
        await _in_thread(self._flush_files)
        entry_format = ENTRY_FORMAT_UNTAGGED if self.config.legacy_untagged_entries else ENTRY_FORMAT_CHANNEL
        checkpoint = StoreCheckpoint(timestamp, timestamp, timestamp, confirm, confirm, applied, entry_format)
        await _in_thread(checkpoint.save, self._checkpoint_path)
        self.checkpoint = checkpoint

    def _check_entry_format(self, checkpoint: StoreCheckpoint) -> None:
        if checkpoint.applied_index >= 0 and checkpoint.entry_format == ENTRY_FORMAT_UNTAGGED \
                and not self.config.legacy_untagged_entries:
            raise StoreStartError(
                f"{self._checkpoint_path}: this store was derived by a version that applied any entry shaped "
                f"like a store entry, including log clients' appends; set legacy_untagged_entries = true in "
                f"the [broker] table of every node to keep serving this log, or move its messages to a new "
                f"cluster")

    def _flush_files(self) -> None:
        assert self.consume_queues is not None
        self.consume_queues.flush()
        if self.index is not None:
            self.index.flush()

    async def persist_configs(self, force: bool = False) -> None:
        async with self._persist_lock:
            # Every snapshot is taken before the first write yields the loop,
            # so together they hold exactly the entries up to `covered`.
            covered = self.applied_index
            snapshots = [(manager, manager.snapshot(force)) for manager in self.managers]
            for manager, snapshot in snapshots:
                if snapshot is not None:
                    await _in_thread(manager.write, snapshot)
            # A manager still decoding a metadata snapshot wrote nothing: its
            # file covers less, and the checkpoint must not pass it.
            if not any(manager.restoring for manager, _ in snapshots):
                self._configs_cover = max(self._configs_cover, covered)

    async def clean_expired(self) -> None:
        """Drop ConsumeQueue files and index files below the log's first entry."""
        queues = self._require_started()[1]
        min_physical = self.commit_log.min_physical_offset()
        deleted = queues.delete_before_phys(min_physical)
        if self.index is not None:
            self.index.delete_expired(min_physical)
        if deleted:
            log.info("deleted %d ConsumeQueue files below physical offset %d", deleted, min_physical)

    # ================================================================= writes
    async def put_messages(self, messages: Sequence[MessageExt]) -> list[PutResult]:
        """Store messages (through this node, which must be the leader) and
        return where they went, once committed. Topics must exist and queue
        ids be in range; see DLedgerCommitLog.put for offsets."""
        ready_from = await self._ready_for_writes()
        for message in messages:
            self._check_put(message)
        assert self.reput is not None
        return await self.commit_log.put(messages, ready_from, self.reput.applied_index)

    def _check_put(self, message: MessageExt) -> None:
        config = self.topics.get(message.topic)
        if config is None:
            raise TopicNotFoundError(f"topic {message.topic!r} does not exist")
        if not 0 <= message.queue_id < config.write_queue_nums:
            raise QueueIdError(f"queue {message.queue_id} of topic {message.topic!r} does not exist "
                               f"(it has {config.write_queue_nums} write queues)")
        if len(message.body) > self.config.max_message_size:
            raise MessageTooLargeError(f"message body of {len(message.body)} bytes exceeds the maximum "
                                       f"of {self.config.max_message_size}")

    async def ready_for_writes(self) -> int:
        """Wait (briefly) until this node may write: it leads and has applied
        the log up to the start of its term, so its derived state (queue
        offsets, the broker's tables) covers everything committed before.
        Returns that index; StoreUnavailableError when it does not lead."""
        return await self._ready_for_writes()

    async def _ready_for_writes(self) -> int:
        """The start of this leader's term, once the store has applied up to it."""
        reput = self._require_started()[0]
        if reput.failure is not None:
            raise reput.failure
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.ready_wait_s
        ms = self.server.member_state
        ready_from = self.server.leader_ready_from()
        # A leader just elected takes a moment to commit the entry opening its term.
        while ready_from is None and ms.is_leader and loop.time() < deadline:
            await asyncio.sleep(READY_POLL_S)
            ready_from = self.server.leader_ready_from()
        if ready_from is None:
            if ms.is_leader:
                raise StoreUnavailableError(f"{self.server.config.self_id} leads term {ms.term} but has not "
                                            f"committed its first entry yet")
            where = f"the leader is {ms.leader_id} at {ms.leader_address}" if ms.leader_id else "no leader yet"
            raise StoreUnavailableError(f"{self.server.config.self_id} is not the leader; {where}",
                                        ms.leader_id, ms.leader_address)
        remaining = max(0.0, deadline - loop.time())
        if reput.applied_index < ready_from and not await reput.wait_applied(ready_from, remaining):
            raise StoreUnavailableError(f"this new leader is still applying the log (at {reput.applied_index}, "
                                        f"its term starts at {ready_from})")
        return ready_from

    async def _maybe_snapshot_metadata(self) -> None:
        """On the leader: a snapshot when metadata changed since the last one,
        and (so that retention can release the segment holding the last one)
        when the last is older than the interval. None while there is no
        metadata at all."""
        if self.server.leader_ready_from() is None:
            return
        if max(manager.applied_index for manager in self.managers) < 0:
            return
        if any(manager.restoring for manager in self.managers):
            return  # its state in memory is not yet as of the log's end
        changed_at = max((manager.changed_index for manager in self.managers if manager.snapshot_on_change),
                         default=-1)
        now = asyncio.get_running_loop().time()
        stale = now - self.snapshots.applied_at >= self.config.metadata_snapshot_interval_s
        if changed_at > self.snapshots.last_as_of or stale:
            try:
                await self.write_metadata_snapshot()
            except (DLedgerError, StoreError) as error:
                # Leadership lost, or no quorum, while writing it: the next
                # leader writes one. Not a reason to stop the node.
                log.warning("metadata snapshot not written: %s", error)

    def _snapshot_floor(self) -> int:
        if self.snapshots.last_index >= 0:
            return self.snapshots.retention_floor()
        has_metadata = max(manager.applied_index for manager in self.managers) >= 0
        return 0 if has_metadata else self.server.store.ledger_end_index + 1

    async def write_metadata_snapshot(self) -> bool:
        """Append every manager's state as of the last entry applied here
        (asOf), without holding writes: see store/metadata_snapshot.py.
        Returns False when a manager's state is still being restored (tried
        again later)."""
        reput = self._require_started()[0]
        await self._ready_for_writes()
        if any(manager.restoring for manager in self.managers):
            return False   # its state in memory is not yet as of what was applied
        # No await between reading the index and the capture: the state is
        # exactly that of entry `as_of` (the handlers have applied every
        # entry up to it and none after). Writes wait only for this step,
        # as they wait for any synchronous work on the loop.
        as_of = reput.dispatched_index
        payload = capture_payload(self.managers, as_of)
        body = await asyncio.to_thread(encode_snapshot, payload)
        index, _, _ = await self.server.append([body], channel=CHANNEL_STATE_MACHINE)
        log.info("metadata snapshot written at entry %d, as of entry %d (%d bytes)", index, as_of, len(body))
        return True

    async def append_system_entry(self, kind: int, payload: dict[str, Any]) -> int:
        """Write a system entry and wait until this node has applied it, so the
        caller reads its effect at once. Returns its index."""
        await self._ready_for_writes()
        try:
            index, _, _ = await self.server.append([encode_system_entry(kind, payload)],
                                                   channel=CHANNEL_STATE_MACHINE)
        except DLedgerError as error:
            raise store_error(error) from None
        assert self.reput is not None
        if not await self.reput.wait_applied(index, self.server.config.max_wait_ack_s):
            # Committed, so it takes effect; the caller just cannot read it here yet.
            raise PutOutcomeUnknownError(f"system entry {index} is committed but not applied here in time")
        return index

    async def update_topic(self, config: TopicConfig) -> None:
        await self.append_system_entry(SystemKind.TOPIC_UPDATE, topic_update_payload(config))

    async def delete_topic(self, topic: str) -> None:
        await self.append_system_entry(SystemKind.TOPIC_DELETE, topic_delete_payload(topic))

    async def update_group(self, config: SubscriptionGroupConfig) -> None:
        await self.append_system_entry(SystemKind.GROUP_UPDATE, group_update_payload(config))

    async def delete_group(self, group: str) -> None:
        await self.append_system_entry(SystemKind.GROUP_DELETE, group_delete_payload(group))

    async def commit_offsets(self, commits: Iterable[OffsetCommit]) -> None:
        commits = list(commits)
        if commits:
            await self.append_system_entry(SystemKind.CONSUMER_OFFSETS, offsets_payload(commits))

    # ================================================================== reads
    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int,
                     tag_hashes: set[int] | None = None, max_bytes: int = DEFAULT_MAX_PULL_BYTES) -> GetMessageResult:
        """Messages of a queue from `offset`, at most `max_count` and about
        `max_bytes`; with `tag_hashes` only those whose tag hash matches (the
        caller still compares tag strings: hashes collide)."""
        queues = self._require_started()[1]
        queue = queues.get(topic, queue_id)
        if queue is None:
            return GetMessageResult(GetStatus.NO_MESSAGE_IN_QUEUE)
        found = queue.get(offset, max_count, tag_hashes)
        result = GetMessageResult(found.status, [], found.next_offset, found.min_offset, found.max_offset)
        used = 0
        for unit in found.units:
            if result.messages and used + unit.size > max_bytes:
                result.next_offset = unit.queue_offset
                break
            message = self.read_message(unit.phys_offset, unit.size)
            if message is None:
                continue  # retention removed it between the queue read and now
            result.messages.append(message)
            used += unit.size
        if found.units and not result.messages and result.status is GetStatus.FOUND:
            result.status = GetStatus.NO_MATCHED_MESSAGE
        return result

    def read_message(self, physical_offset: int, size: int | None = None) -> MessageExt | None:
        """The committed message at a physical offset (None when not there);
        `size`, when known (a ConsumeQueue unit's), saves a read."""
        hot = self.commit_log.read_hot(physical_offset, size)
        if hot is not None:
            return hot
        body = self.commit_log.read(physical_offset, size)
        if body is None:
            return None
        try:
            # The entry's CRC, checked by the read, covers the whole record
            # (an untagged entry may be a log client's bytes: all checks).
            return codec.decode(body, crc_checked=not self.commit_log.legacy_untagged_entries)
        except MessageDecodeError:
            return None  # a system entry, or not a message at all

    def query_messages(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[MessageExt]:
        """Messages of `topic` whose KEYS or message id (UNIQ_KEY) is `key`,
        stored within [begin_ms, end_ms], newest first."""
        if self.index is None:
            return []
        limit = self.commit_log.committed_end() + DLEDGER_HEADER_SIZE
        found: list[MessageExt] = []
        for physical_offset in self.index.query(topic, key, max_num, begin_ms, end_ms, max_phys_offset=limit):
            message = self.read_message(physical_offset)
            if message is not None and message.topic == topic and \
                    (key in message.key_list or message.uniq_key == key) and \
                    begin_ms <= message.store_timestamp <= end_ms:
                found.append(message)
        return found

    def query_message_by_id(self, message_id: str, topic: str | None = None) -> MessageExt | None:
        """The message with this id: an offset message id (store host and
        physical offset, 32 hex digits) is read where it points; a client
        message id (UNIQ_KEY) is looked up in the index under `topic`."""
        try:
            _, physical_offset = decode_offset_message_id(message_id)
        except ValueError:
            physical_offset = None
        if physical_offset is not None:
            return self.read_message(physical_offset)
        if topic is None:
            return None
        found = self.query_messages(topic, message_id, 1, 0, 1 << 62)
        return next((m for m in found if m.uniq_key == message_id), None)

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._require_started()[1].get(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self._require_started()[1].get(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after
        `timestamp_ms` (max_offset when none): a binary search over the queue."""
        queue = self._require_started()[1].get(topic, queue_id)
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = queue.unit_at(middle)
            message = self.read_message(unit.phys_offset, unit.size) if unit is not None else None
            if message is not None and message.store_timestamp < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    async def wait_applied(self, index: int, timeout: float) -> bool:
        """Wait until this node has applied entries up to `index` (what a put
        wrote is then in the derived state); False on timeout."""
        reput = self._require_started()[0]
        return await reput.wait_applied(index, timeout)

    @property
    def applied_index(self) -> int:
        return self.reput.applied_index if self.reput is not None else -1

    def _require_started(self) -> tuple[ReputMessageService, ConsumeQueueStore]:
        if self.reput is None or self.consume_queues is None:
            raise StoreUnavailableError("the message store is not started")
        if self.reput.failure is not None and not isinstance(self.reput.failure, StoreFailedError):
            raise self.reput.failure
        return self.reput, self.consume_queues

    def _queue_end(self, topic: str, queue_id: int) -> int:
        return self.max_offset(topic, queue_id)
