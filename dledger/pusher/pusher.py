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
from typing import Callable, Sequence

from dledger.clock import Clock
from dledger.config import DLedgerConfig, FlushMode
from dledger.entry import MAGIC_NOOP
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState, Role
from dledger.pusher.dispatcher import EntryDispatcher
from dledger.pusher.handler import EntryHandler
from dledger.pusher.quorum import PendingAppend, QuorumAckChecker
from dledger.transport import Transport

if TYPE_CHECKING:
    from dledger.store.file_store import DLedgerFileStore

log = logging.getLogger(__name__)

AppendResult = tuple[int, int, list[int]]  # first index, last index, positions


class DLedgerEntryPusher:
    def __init__(self, config: DLedgerConfig, store: DLedgerFileStore, member_state: MemberState,
                 transport: Transport, clock: Clock, on_commit: Callable[[int], None]) -> None:
        self.config = config
        self.store = store
        self.member_state = member_state
        self.clock = clock
        self.on_commit = on_commit
        self.quorum = QuorumAckChecker(config.self_id, config.peer_ids, config.quorum)
        self.dispatchers = {
            peer: EntryDispatcher(peer, config, store, member_state, transport, self.quorum, clock, self._wake_checker)
            for peer in config.peer_ids if peer != config.self_id}
        self.handler = EntryHandler(config, store, member_state, self._committed)
        self._checker_wakeup = asyncio.Event()
        self._flush_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_term = -1
        member_state.add_listener(self._on_role_change)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for peer, dispatcher in self.dispatchers.items():
            self._tasks.append(loop.create_task(dispatcher.run(), name=f"EntryDispatcher-{peer}"))
        self._tasks.append(loop.create_task(self._quorum_ack_checker(), name="QuorumAckChecker"))
        self._tasks.append(loop.create_task(self._leader_flusher(), name="LeaderFlusher"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.quorum.fail_all(ResponseCode.TERM_CHANGED, "the node is shutting down")

    def _on_role_change(self, role: Role, term: int) -> None:
        self.handler.on_term_change()
        if role is Role.LEADER and term != self._leader_term:
            self._become_leader(term)
        elif role is not Role.LEADER and self._leader_term != -1:
            self._leader_term = -1
            self.quorum.fail_all(ResponseCode.TERM_CHANGED,
                                 f"leadership lost in term {term}; the outcome of the append is unknown")
        for dispatcher in self.dispatchers.values():
            dispatcher.wakeup.set()

    def _become_leader(self, term: int) -> None:
        self._leader_term = term
        self.quorum.start_term(term)
        # Raft: entries of older terms commit only together with one of ours,
        # so start the term with an empty entry rather than wait for a client.
        self.store.append_as_leader([b""], term, magic=MAGIC_NOOP)
        self._entries_appended()

    # ------------------------------------------------------------ appending
    async def append(self, bodies: Sequence[bytes]) -> AppendResult:
        ms = self.member_state
        if not ms.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, "this node is not the leader",
                               leader_id=ms.leader_id, leader_address=ms.leader_address)
        if ms.transferee:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING,
                               f"leadership is being transferred to {ms.transferee}")
        if self.quorum.pending_entries() + len(bodies) > self.config.max_pending_requests:
            raise DLedgerError(ResponseCode.LEADER_PENDING_FULL,
                               f"{self.quorum.pending_entries()} entries already wait for a quorum")
        placed = self.store.append_as_leader(bodies, ms.term)
        now = self.clock.now()
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self.quorum.add_pending(PendingAppend(placed[0][0], placed[-1][0], [pos for _, pos in placed],
                                              now, now + self.config.max_wait_ack_s, future))
        self._entries_appended()
        return await future

    def _entries_appended(self) -> None:
        if self.config.flush_mode is FlushMode.ASYNC:
            self.quorum.update_watermark(self._leader_term, self.config.self_id, self.store.ledger_end_index)
            self._checker_wakeup.set()
        self._flush_wakeup.set()
        for dispatcher in self.dispatchers.values():
            dispatcher.wakeup.set()

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
            flushed = await self.store.flush()
            if self.config.flush_mode is FlushMode.SYNC and term == self._leader_term and term != -1:
                if self.quorum.update_watermark(term, self.config.self_id, flushed):
                    self._checker_wakeup.set()

    def _wake_checker(self) -> None:
        self._checker_wakeup.set()

    async def _quorum_ack_checker(self) -> None:
        while True:
            deadline = self.quorum.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock.now())
            try:
                await asyncio.wait_for(self._checker_wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._checker_wakeup.clear()
            self.check_quorum()
            self.quorum.expire(self.clock.now())

    def check_quorum(self) -> None:
        ms = self.member_state
        if not ms.is_leader or self._leader_term != ms.term:
            return
        committed = self.quorum.compute_committed(ms.term, ms.committed_index, self.store.term_at)
        if committed > ms.committed_index:
            ms.committed_index = committed
            self.store.set_committed_index(committed)
            self.quorum.complete_up_to(committed)
            self.on_commit(committed)
            for dispatcher in self.dispatchers.values():
                dispatcher.wakeup.set()

    def _committed(self, index: int) -> None:
        self.on_commit(index)
