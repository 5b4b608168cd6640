"""DLedgerEntryPusher: the leader's append path and replication, assembled.

It owns one EntryDispatcher per peer, the follower's EntryHandler, and the
QuorumAckChecker task. Client appends are written to the local log at once
(page cache), handed to the dispatchers (which push before the leader's own
fdatasync has finished, so the leader's and the followers' flushes overlap),
and complete when the commit index passes them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import logging
import os
import time
from collections import OrderedDict
from typing import Callable, Sequence

from dledger.clock import Clock
from dledger.config import DLedgerConfig, FlushMode
from dledger.entry import CHANNEL_LOG_API, MAGIC_CONFIG_CHANGE, MAGIC_NOOP, MAGIC_NORMAL, MAGIC_PRODUCER_MARK
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState, Role
from dledger.membership import Membership, MembershipLog, learner_to_promote
from dledger.pusher.dispatcher import EntryDispatcher
from dledger.pusher.handler import EntryHandler
from dledger.producer_table import AppendedRange, Mark, ProducerTable, Snapshot, decode_mark, encode_mark
from dledger.pusher.quorum import PendingAppend, QuorumAckChecker
from dledger.tasks import start_task
from dledger.transport import Transport
from dledger.waiting import wait_event

if TYPE_CHECKING:
    from dledger.store.file_store import AppendHook, DLedgerFileStore

log = logging.getLogger(__name__)

AppendResult = tuple[int, int, list[int]]  # first index, last index, positions


class DLedgerEntryPusher:
    def __init__(self, config: DLedgerConfig, store: DLedgerFileStore, member_state: MemberState,
                 transport: Transport, clock: Clock, on_commit: Callable[[int], None],
                 membership: MembershipLog) -> None:
        self.config = config
        self.store = store
        self.member_state = member_state
        self.transport = transport
        self.clock = clock
        self.on_commit = on_commit
        self.membership = membership
        current = membership.current
        self.quorum = QuorumAckChecker(config.self_id, current.ids, current.quorum)
        self.quorum.set_voters(current.voters, current.quorum)
        # One dispatcher per member but this node, learners included; created
        # and stopped as the configuration changes.
        self.dispatchers = {peer: self._new_dispatcher(peer) for peer in membership.replication_targets()}
        self._dispatcher_tasks: dict[str, asyncio.Task[None]] = {}
        # The incarnation each dispatcher serves (a moved member is a new server).
        self._incarnations = {peer: membership.incarnation_of(peer) for peer in self.dispatchers}
        # Called once when this leader's own removal has committed; by default
        # it just steps down (the server hands leadership over first).
        self.on_removed: Callable[[], None] = self.step_down_removed
        self._removed_in_term = -1
        self.handler = EntryHandler(config, store, member_state, self._committed)
        self.handler.on_reset_membership = membership.install
        self._checker_wakeup = asyncio.Event()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._flush_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_term = -1
        self._last_commit_at = float("-inf")   # as leader: when the commit index last moved
        self._term_first_index = 0
        # Idempotent appends: the producer table holds what is committed; this
        # term's own appends (in mark order) answer retries until committed.
        self.producers = self._new_table()
        self._term_appends: OrderedDict[tuple[str, int], AppendedRange] = OrderedDict()
        # The producer marks this leader wrote in its term, by index, until
        # applied: the table is fed from them instead of reading each back
        # from the log as the commit reaches it (two reads and a CRC on the
        # way of every answer). None once an append failed (then a mark may
        # be in the log and not here: the log is read again until the next term).
        self._marks_written: OrderedDict[int, Mark] | None = OrderedDict()
        member_state.add_listener(self._on_role_change)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for peer, dispatcher in self.dispatchers.items():
            self._dispatcher_tasks[peer] = start_task(dispatcher.run(), f"EntryDispatcher-{peer}")
        self._tasks.append(start_task(self._quorum_ack_checker(), "QuorumAckChecker"))
        self._tasks.append(start_task(self._leader_flusher(), "LeaderFlusher"))
        self.membership.listeners.append(self._on_membership_change)

    async def stop(self) -> None:
        if self._on_membership_change in self.membership.listeners:
            self.membership.listeners.remove(self._on_membership_change)
        tasks = self._tasks + list(self._dispatcher_tasks.values())
        for task in tasks:
            task.cancel()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._dispatcher_tasks.clear()
        self.quorum.fail_all(ResponseCode.TERM_CHANGED, "the node is shutting down")

    def _on_role_change(self, role: Role, term: int) -> None:
        self.handler.on_term_change()
        if role is Role.LEADER and term != self._leader_term:
            self._become_leader(term)
        elif role is not Role.LEADER and self._leader_term != -1:
            self._leader_term = -1
            # This term's uncommitted appends may be cut by the next leader;
            # only the table, fed from committed entries, speaks for them now.
            self._term_appends.clear()
            self.quorum.fail_all(ResponseCode.TERM_CHANGED,
                                 f"leadership lost in term {term}; the outcome of the append is unknown")
        for dispatcher in self.dispatchers.values():
            dispatcher.wakeup.set()

    # ------------------------------------------------------------ membership
    def _new_dispatcher(self, peer: str) -> EntryDispatcher:
        dispatcher = EntryDispatcher(peer, self.config, self.store, self.member_state, self.transport, self.quorum,
                                     self.clock, self._wake_checker)
        dispatcher.committed_membership = lambda: (self.membership.committed_index,
                                                   self.membership.committed.to_json())
        dispatcher.last_commit_at = lambda: self._last_commit_at
        return dispatcher

    def _on_membership_change(self, current: Membership) -> None:
        """Count the new voters, and replicate to exactly the servers the
        configurations held name (a removed server until its removal commits)."""
        self.quorum.set_voters(current.voters, current.quorum)
        targets = self.membership.replication_targets()
        for peer in [p for p in self.dispatchers
                     if p not in targets or self._incarnations.get(p, 0) != self.membership.incarnation_of(p)]:
            del self.dispatchers[peer]
            task = self._dispatcher_tasks.pop(peer, None)
            if task is not None:
                task.cancel()
            if self.member_state.is_leader:
                log.info("no longer replicating to %s%s", peer,
                         " at its old address" if peer in targets else "")
        for peer in targets:
            if peer not in self.dispatchers:
                # A server added under an id that was a member before, or
                # moved to a new address, starts from nothing: it may be a
                # new, empty server, whatever the old one acknowledged.
                self.quorum.forget(peer)
                self._incarnations[peer] = self.membership.incarnation_of(peer)
                dispatcher = self.dispatchers[peer] = self._new_dispatcher(peer)
                self._dispatcher_tasks[peer] = start_task(dispatcher.run(), f"EntryDispatcher-{peer}")
                if self.member_state.is_leader:
                    log.info("replicating to %s at %s from now on", peer, self.membership.address_of(peer))
        self._checker_wakeup.set()

    async def append_config(self, membership: Membership) -> AppendResult:
        """Append a configuration entry (it takes effect at once, through the
        store's hook) and wait for its commit. The caller checked the rules."""
        self._check_can_append(1)
        placed = self.store.append_as_leader([membership.to_json()], self.member_state.term,
                                             magic=MAGIC_CONFIG_CHANGE)
        return await self._wait_for_new(placed)

    def _maybe_promote(self) -> None:
        """A learner that has caught up becomes a voter (one change at a time:
        only once no other change is uncommitted)."""
        membership, ms = self.membership, self.member_state
        current = membership.current
        if not current.learners or membership.pending_index >= 0 or not self.is_ready() or ms.transferee:
            return
        learner = learner_to_promote(current, lambda peer: self.quorum.watermark(ms.term, peer),
                                     self.store.ledger_end_index, ms.committed_index)
        if learner is None:
            return
        log.info("%s has caught up (acknowledged %d of %d): promoting it to voter", learner,
                 self.quorum.watermark(ms.term, learner), self.store.ledger_end_index)
        try:
            placed = self.store.append_as_leader([current.promoted(learner).to_json()], ms.term,
                                                 magic=MAGIC_CONFIG_CHANGE)
        except DLedgerError as error:
            log.warning("cannot promote %s now: %s", learner, error.message)
            return
        self._entries_appended()
        log.info("promotion of %s appended at %d", learner, placed[0][0])

    def _step_down_if_removed(self) -> None:
        """A leader that removed itself leads until the removal commits (it
        replicates it without counting itself), then steps down; it is not a
        voter any more, so it never campaigns again."""
        ms = self.member_state
        if ms.is_leader and self.membership.pending_index < 0 and self._removed_in_term != ms.term and \
                not self.membership.current.is_voter(self.config.self_id):
            self._removed_in_term = ms.term
            self.on_removed()

    def step_down_removed(self) -> None:
        ms = self.member_state
        if ms.is_leader:
            log.info("this leader's removal is committed: stepping down in term %d", ms.term)
            ms.change_to_candidate()

    def _become_leader(self, term: int) -> None:
        self._leader_term = term
        self._term_appends.clear()
        self._marks_written = OrderedDict()
        self.quorum.start_term(term)
        try:
            self._drop_torn_batch()
            # Raft: entries of older terms commit only together with one of
            # ours, so start the term with an empty entry, not a client's.
            placed = self.store.append_as_leader([b""], term, magic=MAGIC_NOOP)
        except DLedgerError as error:
            # (This runs inside a role listener: raising would kill the task
            # that changed the role, the election loop.)
            log.error("cannot open term %d as leader (%s): stepping down", term, error.message)
            asyncio.get_running_loop().call_soon(self._step_down, term)
            return
        self._term_first_index = placed[0][0]
        self._entries_appended()

    def _step_down(self, term: int) -> None:
        ms = self.member_state
        if ms.is_leader and ms.term == term:
            ms.change_to_candidate()

    # ------------------------------------------------------------ appending
    async def append(self, bodies: Sequence[bytes], producer_id: str = "", sequence: int = -1,
                     prepare: AppendHook | None = None, channel: int = CHANNEL_LOG_API,
                     retry_age_ms: int = 0) -> AppendResult:
        """Append `bodies` and wait for their commit. With a producer id, a
        (producer_id, sequence) the log already holds is answered with its
        original indexes instead of being appended again (and `prepare`, the
        store's append hook, is not called). `prepare` gets the bodies'
        positions before they are written; `channel` says who writes them
        (dledger/entry.py)."""
        self._check_can_append(len(bodies))
        after_apply = channel != CHANNEL_LOG_API
        if producer_id:
            appended = self._appended_before(producer_id, sequence, retry_age_ms)
            if appended is not None:
                return await self._wait_for(appended, after_apply)
        ms = self.member_state
        if not producer_id:
            return await self._wait_for_new(self.store.append_as_leader(bodies, ms.term, prepare=prepare,
                                                                        channel=channel), after_apply)
        mark = Mark(producer_id, sequence, len(bodies), int(time.time() * 1000))
        encoded = encode_mark(producer_id, sequence, mark.count, mark.written_ms)
        try:
            placed = self.store.append_as_leader(
                [encoded, *bodies], ms.term, magics=[MAGIC_PRODUCER_MARK] + [MAGIC_NORMAL] * len(bodies),
                prepare=None if prepare is None else lambda positions: prepare(positions[1:]), channel=channel)
        except BaseException:
            self._marks_written = None   # written or not: the log says
            raise
        if self._marks_written is not None:
            self._marks_written[placed[0][0]] = mark
        self._term_appends[(producer_id, sequence)] = AppendedRange(placed[1][0], placed[-1][0])
        return await self._wait_for_new(placed[1:], after_apply)

    def _check_can_append(self, count: int) -> None:
        ms = self.member_state
        if not ms.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, "this node is not the leader",
                               leader_id=ms.leader_id, leader_address=ms.leader_address)
        if not self.is_ready():
            raise DLedgerError(ResponseCode.LEADER_NOT_READY,
                               f"the leader of term {ms.term} is still committing its first entry")
        if ms.transferee:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING,
                               f"leadership is being transferred to {ms.transferee}")
        if self.quorum.pending_entries() + count > self.config.max_pending_requests:
            raise DLedgerError(ResponseCode.LEADER_PENDING_FULL,
                               f"{self.quorum.pending_entries()} entries already wait for a quorum")

    @property
    def term_first_index(self) -> int:
        """The index of the NOOP that opened this leader's term."""
        return self._term_first_index

    def is_ready(self) -> bool:
        """A new leader takes appends only once the entry that opened its term
        is committed and applied: then everything before it is committed too,
        and the producer table (and any user state machine) knows the whole log.
        RocketMQ's DLedger broker waits the same way before acting as master."""
        return (self._leader_term == self.member_state.term
                and self.producers.applied_index >= self._term_first_index)

    def _new_table(self) -> ProducerTable:
        return ProducerTable(window_ms=int(self.config.producer_window_s * 1000))

    def _appended_before(self, producer_id: str, sequence: int, retry_age_ms: int) -> AppendedRange | None:
        appended = self._term_appends.get((producer_id, sequence))
        if appended is not None:
            return appended
        return self.producers.lookup(producer_id, sequence, retry_age_ms)

    async def _wait_for(self, appended: AppendedRange, after_apply: bool = True) -> AppendResult:
        """Answer a retried append with its original range, once committed."""
        store = self.store
        positions = [store.position_of(i) for i in range(max(appended.first_index, store.ledger_begin_index),
                                                             appended.last_index + 1)]
        if self.member_state.committed_index >= appended.last_index:
            return appended.first_index, appended.last_index, positions
        return await self._wait(appended.first_index, appended.last_index, positions, after_apply)

    async def _wait_for_new(self, placed: list[tuple[int, int]], after_apply: bool = True) -> AppendResult:
        self._entries_appended()
        return await self._wait(placed[0][0], placed[-1][0], [pos for _, pos in placed], after_apply)

    async def _wait(self, first: int, last: int, positions: list[int], after_apply: bool = True) -> AppendResult:
        now = self.clock.now()
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self.quorum.add_pending(PendingAppend(first, last, positions, now, now + self.config.max_wait_ack_s, future,
                                              after_apply=after_apply))
        self._arm_expiry()
        return await future

    def _arm_expiry(self) -> None:
        """One timer for the earliest deadline of the waiting appends, armed
        when none is and again each time it fires. Every deadline is arrival
        plus the same wait, so a later append never needs it sooner; waking
        the QuorumAckChecker task for each append instead cost a task turn
        per append."""
        if self._expiry_timer is not None:
            return
        deadline = self.quorum.next_deadline()
        if deadline is not None:
            self._expiry_timer = asyncio.get_running_loop().call_later(
                max(0.0, deadline - self.clock.now()), self._expiry_due)

    def _expiry_due(self) -> None:
        self._expiry_timer = None
        self.quorum.expire(self.clock.now())
        self._arm_expiry()

    def _whole_batches_only(self, committed: int) -> int:
        """Round a commit index down so it never stops inside an idempotent
        batch of this term: such a batch commits whole or not at all, which is
        what lets its mark speak for all of its entries (and what makes a new
        leader free to drop a torn batch at the end of its log)."""
        for appended in self._term_appends.values():  # in index order
            if appended.mark_index > committed:
                break
            if appended.last_index > committed:
                return appended.mark_index - 1
        return committed

    def _drop_torn_batch(self) -> None:
        """At the start of a term: an idempotent batch that the end of our log
        cuts short was never committed anywhere (commits stop only between
        batches, and a node missing a committed entry cannot win a vote), so it
        goes rather than be committed without all of its entries."""
        store = self.store
        marks = store.indexes_with_magic(self.member_state.committed_index + 1, store.ledger_end_index,
                                         MAGIC_PRODUCER_MARK)
        if not marks:
            return
        count = decode_mark(store.get(marks[-1]).body).count
        if marks[-1] + count > store.ledger_end_index:
            log.warning("dropping the torn idempotent batch at %d..%d (log ends at %d) before leading",
                        marks[-1], marks[-1] + count, store.ledger_end_index)
            store.truncate(marks[-1] - 1)

    # -------------------------------------------------------- producer table file
    def load_producers(self, path: str) -> None:
        """Start from the table's snapshot and replay the committed marks after it.
        A snapshot the log cannot continue (entries after it were deleted, or
        it is ahead of the log) is dropped and the table rebuilt from the log."""
        store = self.store
        table = self._new_table()
        if os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                snapshot = ProducerTable.from_json(file.read(), window_ms=table.window_ms)
            if store.ledger_begin_index - 1 <= snapshot.applied_index <= store.ledger_end_index:
                table = snapshot
            else:
                log.warning("producer table snapshot at %d does not fit the log [%d, %d]; rebuilding it",
                            snapshot.applied_index, store.ledger_begin_index, store.ledger_end_index)
        if table.applied_index < store.ledger_begin_index - 1:
            table.advance(store.ledger_begin_index - 1)
        self.producers = table
        self.apply_committed(self.member_state.committed_index)
        log.info("producer table: %d producers, applied to %d", len(table), table.applied_index)

    def producers_snapshot(self) -> tuple[int, Callable[[], Snapshot]] | None:
        """(index covered, the table's encoder: see ProducerTable.capture) if
        everything it covers is on disk and it changed; None to skip this
        time. The caller encodes and writes the file."""
        table = self.producers
        if table.applied_index > self.store.flushed_index:
            return None
        encode = table.capture()
        return None if encode is None else (table.applied_index, encode)

    # -------------------------------------------------------- applying commits
    def apply_committed(self, committed: int) -> None:
        """Feed the producer marks of newly committed entries to the table, in
        index order. Called on every node whenever its commit index moves."""
        table, store = self.producers, self.store
        start = table.applied_index + 1
        if committed < start:
            return
        written = self._marks_written
        # Every entry from `start` on this leader's own: its marks are all in `written`.
        own = written is not None and self._leader_term == self.member_state.term and start > self._term_first_index
        if not own:
            for index in store.indexes_with_magic(start, committed, MAGIC_PRODUCER_MARK):
                table.apply_mark(index, decode_mark(store.get(index).body))
        while written and next(iter(written)) <= committed:
            index, mark = written.popitem(last=False)
            if own:
                table.apply_mark(index, mark)
        table.advance(committed)
        while self._term_appends:
            key, appended = next(iter(self._term_appends.items()))
            if appended.last_index > committed:
                break
            del self._term_appends[key]  # the table answers for it from now on
        if self._leader_term == self.member_state.term and committed >= self._term_first_index:
            self._wake_for_membership()

    def _entries_appended(self) -> None:
        if self.config.flush_mode is FlushMode.ASYNC:
            self.quorum.update_watermark(self._leader_term, self.config.self_id, self.store.ledger_end_index)
            self._checker_wakeup.set()
        # The pushes first, then the local flush: the followers' round trip
        # (network, their fsync, the answer) is the longer way to a quorum,
        # and the flusher's hand-off of its fsync to a thread, woken first,
        # held both pushes back by its turn. (The flush whatever a push met.)
        try:
            for dispatcher in self.dispatchers.values():
                dispatcher.push_now()
        finally:
            self._flush_wakeup.set()

    # ------------------------------------------------------------- the tasks
    async def _leader_flusher(self) -> None:
        """Group commit on the leader: every append that lands while an fdatasync
        runs rides on the next one. In ASYNC mode: a flush every flush_interval_s."""
        while True:
            if self.config.flush_mode is FlushMode.ASYNC:
                await asyncio.sleep(self.config.flush_interval_s)
            else:
                await self._flush_wakeup.wait()
            self._flush_wakeup.clear()
            if self.store.flushed_index >= self.store.ledger_end_index:
                continue
            term = self._leader_term
            try:
                flushed = await self.store.flush()
            except DLedgerError:
                if self.store.failure:
                    return  # a failed fsync: the store is stopping the node
                raise
            if self.config.flush_mode is FlushMode.SYNC and term == self._leader_term and term != -1:
                if self.quorum.update_watermark(term, self.config.self_id, flushed):
                    self._wake_checker()

    def _wake_checker(self) -> None:
        """A watermark rose. The commit it allows is taken here and now, not
        when the checker task next runs: that wake-up was one event-loop turn
        (about 0.1 ms of an append's 3 ms at one in flight) on every commit.
        The task runs the membership checks, when there may be one to make."""
        if self._advance_commit():
            self._wake_for_membership()

    def _wake_for_membership(self) -> None:
        """Wake the checker task if a commit may give check_quorum a
        membership step to take; in a steady configuration a wake-up per
        commit only found nothing to do."""
        if self._membership_step_possible():
            self._checker_wakeup.set()

    def _membership_step_possible(self) -> bool:
        """A learner to promote, or this leader's own removal to finish."""
        current = self.membership.current
        return bool(current.learners) or not current.is_voter(self.config.self_id)

    async def _quorum_ack_checker(self) -> None:
        while True:
            deadline = self.quorum.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock.now())
            await wait_event(self._checker_wakeup, timeout)
            self._checker_wakeup.clear()
            self.check_quorum()
            self.quorum.expire(self.clock.now())

    def check_quorum(self) -> None:
        if self._advance_commit() and self._membership_step_possible():
            self._maybe_promote()
            self._step_down_if_removed()

    def _advance_commit(self) -> bool:
        """Commit what the watermarks allow and complete the appends waiting
        for it; False when this node does not lead in the pusher's term."""
        ms = self.member_state
        if not ms.is_leader or self._leader_term != ms.term:
            return False
        committed = self._whole_batches_only(
            self.quorum.compute_committed(ms.term, ms.committed_index, self.store.term_at))
        if committed > ms.committed_index:
            ms.committed_index = committed
            self._last_commit_at = self.clock.now()
            self.store.set_committed_index(committed)
            # The appends this commit completes are answered before what it
            # wakes (their tasks then run first: at one append in flight they
            # had waited behind all of it): a log client's plain appends
            # before the apply loop, the others (a store resumes expecting its
            # entry applied here) after it and before the dispatchers.
            held: list[PendingAppend] = []
            self.quorum.complete_up_to(committed, held)
            self.on_commit(committed)
            self.quorum.complete(held)
            for dispatcher in self.dispatchers.values():
                dispatcher.commit_moved()
        # Also completes a retried append that joined after its range committed.
        self.quorum.complete_up_to(ms.committed_index)
        return True

    def _committed(self, index: int) -> None:
        self.on_commit(index)
