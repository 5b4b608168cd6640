"""EntryHandler: the follower's side of replication.

COMPARE, TRUNCATE and COMMIT are answered at once; an APPEND is written only
when its first index is exactly ledger end + 1. Appends that arrive early (the
leader pipelines several pushes and they can overtake each other) wait in a map
keyed by first index until the gap before them closes; if the gap outlives
`follower_gap_timeout_s` they fail with INCONSISTENT_STATE and the leader goes
back to COMPARE. A second push with the same first index answers REPEATED_PUSH.

The follower's commit index only moves inside the prefix it has verified
against the current leader (`verified_end`): a stale suffix from an old term
is never marked committed, even if the leader's commit index covers its indexes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from dledger.config import DLedgerConfig, FlushMode
from dledger.entry import decode_header
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.store.file_store import DLedgerFileStore

log = logging.getLogger(__name__)


@dataclass
class _WaitingAppend:
    request: pb.PushEntryRequest
    done: asyncio.Future[None] = field(repr=False)


def skip_entries(data: bytes, count: int) -> int:
    """Byte offset just past the first `count` encoded entries of `data`."""
    offset = 0
    for _ in range(count):
        offset += decode_header(data, offset).size
    return offset


class EntryHandler:
    def __init__(self, config: DLedgerConfig, store: DLedgerFileStore, member_state: MemberState,
                 on_commit: Callable[[int], None]) -> None:
        self.config = config
        self.store = store
        self.member_state = member_state
        self.on_commit = on_commit
        self.on_repaired: Callable[[], None] = lambda: None
        # A reset brings the leader's committed configuration (index, JSON).
        self.on_reset_membership: Callable[[int, bytes], None] = lambda index, body: None
        self.verified_end = -1
        self._verified_term = -1   # the term whose leader verified_end was checked against
        self._waiting: dict[int, _WaitingAppend] = {}

    # ------------------------------------------------------------ lifecycle
    def on_term_change(self) -> None:
        """Called on every role change. In a new term only the committed prefix
        is known to match the new leader. Within the same term the leader is
        the same node (one leader per term), so what was verified against it
        stays verified: a follower that briefly turned candidate and hears the
        same leader again must not forget it, or its commit index would stay
        behind until the next append."""
        if self.member_state.term == self._verified_term:
            return
        self._verified_term = self.member_state.term
        self.verified_end = self.member_state.committed_index
        self._fail_waiting("the term changed")

    def _fail_waiting(self, why: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for w in waiting.values():
            if not w.done.done():
                w.done.set_exception(DLedgerError(ResponseCode.INCONSISTENT_STATE, why))

    # ------------------------------------------------------------- dispatch
    async def handle(self, request: pb.PushEntryRequest) -> pb.PushEntryResponse:
        """The caller has checked the group, the sender and the term."""
        kind = request.type
        if kind == pb.APPEND:
            # What the leader has committed of the prefix already verified is
            # committed here now, while this push's entries are written and
            # synced, rather than after: then applying it (the apply loop's
            # wake-up, the producer marks) does not hold this push's answer up.
            self.advance_commit(request.committed_index)
            response = await self._append(request)
        elif kind == pb.COMPARE:
            response = self._compare(request)
        elif kind == pb.TRUNCATE:
            response = self._truncate(request)
        elif kind == pb.COMMIT:
            self._verify_at_commit(request)
            await self._flush_what_is_written()
            response = self._response(request)
        else:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown push type {kind}")
        self.advance_commit(request.committed_index)
        return response

    def _verify_at_commit(self, request: pb.PushEntryRequest) -> None:
        """A COMMIT push names the leader's term at its commit index (`index`,
        `index_term`): holding an entry of that term there, this log matches
        the leader's up to it (Raft's log matching), as a COMPARE would show.
        Without it a follower restarted with a checkpoint older than its log
        verified nothing past that checkpoint until the next APPEND, and with
        no new writes its commit index stayed behind."""
        store, index = self.store, request.index
        if request.index_term <= 0 or index <= self.verified_end:
            return  # a leader that does not send it, or nothing new to verify
        if store.ledger_begin_index <= index <= store.ledger_end_index and \
                store.term_at(index) == request.index_term:
            self.verified_end = index

    def advance_commit(self, leader_committed: int) -> None:
        new = min(leader_committed, self.verified_end, self.store.ledger_end_index)
        if new > self.member_state.committed_index:
            self.member_state.committed_index = new
            self.store.set_committed_index(new)
            self.on_commit(new)

    def _response(self, request: pb.PushEntryRequest, code: int = ResponseCode.SUCCESS,
                  message: str = "") -> pb.PushEntryResponse:
        store = self.store
        flushed = (store.flushed_index if self.config.flush_mode is FlushMode.SYNC
                   else store.ledger_end_index)
        self._check_repaired(min(store.flushed_index, self.verified_end))
        return pb.PushEntryResponse(
            header=pb.Header(code=code, message=message, term=self.member_state.term,
                             leader_id=self.member_state.leader_id, local_id=self.config.self_id),
            type=request.type, index=request.index,
            ledger_end_index=store.ledger_end_index, ledger_end_term=store.ledger_end_term,
            flushed_index=min(flushed, self.verified_end), conflict_term=-1, conflict_index=-1,
            ledger_begin_index=store.ledger_begin_index, repairing=self.member_state.repairing)

    def _check_repaired(self, held: int) -> None:
        """A repairing node is a member again once it holds, on disk and
        verified against the leader, everything up to what it once acknowledged."""
        ms = self.member_state
        if ms.repairing and held >= ms.repair_until:
            log.info("repair complete: entries up to %d are on disk again; voting and counting again",
                     ms.repair_until)
            ms.finish_repair()
            self.on_repaired()

    # -------------------------------------------------------------- COMPARE
    def _compare(self, request: pb.PushEntryRequest) -> pb.PushEntryResponse:
        store, index = self.store, request.index
        if index > store.ledger_end_index:
            return self._response(request, ResponseCode.INCONSISTENT_STATE,
                                  f"index {index} is past my ledger end {store.ledger_end_index}")
        if index < store.ledger_begin_index - 1:
            return self._response(request, ResponseCode.INCONSISTENT_STATE,
                                  f"index {index} is below my ledger begin {store.ledger_begin_index}")
        my_term = store.term_at(index)
        if my_term == request.index_term:
            self.verified_end = index
            return self._response(request)
        response = self._response(request, ResponseCode.INCONSISTENT_STATE,
                                  f"term at {index} is {my_term}, leader has {request.index_term}")
        response.conflict_term = my_term
        response.conflict_index = store.first_index_of_term(my_term, index)
        return response

    # ------------------------------------------------------------- TRUNCATE
    def _truncate(self, request: pb.PushEntryRequest) -> pb.PushEntryResponse:
        store, index = self.store, request.index
        self._fail_waiting("truncated")
        if request.reset:
            log.warning("reset log to begin at %d (pos %d) on the leader's request", index + 1, request.reset_pos)
            store.reset(index + 1, request.reset_pos, request.index_term, request.reset_chain_crc)
            if request.membership:
                self.on_reset_membership(request.membership_index, request.membership)
        else:
            if index > store.ledger_end_index or store.term_at(index) != request.index_term:
                return self._response(request, ResponseCode.INCONSISTENT_STATE,
                                      f"cannot keep up to {index}: it does not match the leader")
            if store.ledger_end_index > index:
                log.info("truncate after %d (end was %d)", index, store.ledger_end_index)
                store.truncate(index)
        self.verified_end = index
        return self._response(request)

    # --------------------------------------------------------------- APPEND
    async def _append(self, request: pb.PushEntryRequest) -> pb.PushEntryResponse:
        first = request.index
        if first in self._waiting:
            return self._response(request, ResponseCode.REPEATED_PUSH, f"push at {first} is already queued")
        end = self.store.ledger_end_index
        if first > end + 1:
            waiting = _WaitingAppend(request, asyncio.get_running_loop().create_future())
            self._waiting[first] = waiting
            try:
                await asyncio.wait_for(asyncio.shield(waiting.done), self.config.follower_gap_timeout_s)
            except asyncio.TimeoutError:
                self._forget_waiting(first, waiting)
                return self._response(request, ResponseCode.INCONSISTENT_STATE,
                                      f"gap before {first} not filled (ledger end {self.store.ledger_end_index})")
            except asyncio.CancelledError:
                # The push's call went away (the leader's stream closed): the
                # leader resends. Left queued, a term change or truncation
                # failed its future with nobody to see it (asyncio logged
                # "Future exception was never retrieved" in chaos runs).
                self._forget_waiting(first, waiting)
                raise
            except DLedgerError as e:
                return self._response(request, e.code, e.message)
        else:
            self._write(request)
            self._drain_waiting()
        last = first + request.entry_count - 1
        if self.config.flush_mode is FlushMode.SYNC and self.store.flushed_index < last:
            await self.store.flush()
        return self._response(request)

    def _forget_waiting(self, first: int, waiting: _WaitingAppend) -> None:
        if self._waiting.get(first) is waiting:
            del self._waiting[first]

    async def _flush_what_is_written(self) -> None:
        """An APPEND whose call was cancelled (its deadline passed while the
        disk was slow) leaves entries unflushed that no later APPEND may
        cover: the leader's COMMIT pushes get them onto the disk and report it."""
        if self.config.flush_mode is FlushMode.SYNC and self.store.flushed_index < self.store.ledger_end_index:
            await self.store.flush()

    def _write(self, request: pb.PushEntryRequest) -> None:
        """Write the part of `request` past our verified end; raises on a mismatch."""
        store, first, count = self.store, request.index, request.entry_count
        last = first + count - 1
        end = store.ledger_end_index
        if first <= end:
            # A resend after a lost ack or a rewind: skip what we already hold,
            # which is only safe inside the prefix verified against this leader.
            if end > self.verified_end:
                raise DLedgerError(ResponseCode.INCONSISTENT_STATE,
                                   f"push at {first} overlaps unverified entries up to {end}")
            if last <= end:
                return
            skip = end - first + 1
            data = request.entries[skip_entries(request.entries, skip):]
            store.append_as_follower(data, end + 1, count - skip)
        else:
            store.append_as_follower(request.entries, first, count)
        self.verified_end = store.ledger_end_index

    def _drain_waiting(self) -> None:
        while True:
            waiting = self._waiting.pop(self.store.ledger_end_index + 1, None)
            if waiting is None:
                return
            try:
                self._write(waiting.request)
            except DLedgerError as e:
                waiting.done.set_exception(e)
                continue
            waiting.done.set_result(None)
