"""QuorumAckChecker: per-term watermarks in, the committed index out, pending
client appends completed in order.

Raft's rule (§5.4.2, the figure-8 case): the leader commits by counting replicas
only an entry of its own term; older entries are committed with it. Watermarks
are kept per term (DLedger's peerWaterMarksByTerm) and reset when a term starts,
and the leader appends an empty NOOP entry at the start of its term so that the
commit index moves without waiting for a client write.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from dledger.errors import DLedgerError, ResponseCode

log = logging.getLogger(__name__)


def quorum_index(watermarks: list[int], quorum: int) -> int:
    """The largest index that at least `quorum` of the watermarks have reached."""
    if len(watermarks) < quorum:
        return -1
    return sorted(watermarks, reverse=True)[quorum - 1]


def next_committed_index(committed: int, watermarks: list[int], quorum: int, term: int,
                         term_at: Callable[[int], int]) -> int:
    """The new committed index: the quorum index if it is past `committed` and
    its entry belongs to the current `term`; else `committed` unchanged."""
    candidate = quorum_index(watermarks, quorum)
    if candidate <= committed:
        return committed
    if term_at(candidate) != term:
        return committed
    return candidate


@dataclass
class PendingAppend:
    """A client append waiting for entries first_index..last_index to commit."""
    first_index: int
    last_index: int
    positions: list[int]
    started: float
    deadline: float
    future: asyncio.Future[tuple[int, int, list[int]]] = field(repr=False)
    # Set once it left the pending count: completed, expired or failed. Not
    # future.done(), which a caller that went away (cancelled) also makes true.
    settled: bool = False
    # Answered only once the commit has been handed to the state machine (a
    # store reads its entry's effect when it resumes); a log client's plain
    # append is answered before (see DLedgerEntryPusher._advance_commit).
    after_apply: bool = True


class QuorumAckChecker:
    def __init__(self, self_id: str, peer_ids: list[str], quorum: int) -> None:
        self.self_id = self_id
        self.peer_ids = peer_ids
        # Only the voters of the current configuration count (a learner's
        # watermark is kept, for its promotion, but never makes a commit).
        self.voters = list(peer_ids)
        self.quorum = quorum
        self.watermarks_by_term: dict[int, dict[str, int]] = {}
        # Waiting appends, by last index (completion order) and by arrival
        # (deadline order: every deadline is arrival + the same wait). Several
        # may wait for one range: a retried idempotent append joins the first.
        self._by_index: list[tuple[int, int, PendingAppend]] = []
        self._by_deadline: deque[PendingAppend] = deque()
        self._counter = itertools.count()
        self._pending_entries = 0

    def set_voters(self, voters: list[str], quorum: int) -> None:
        """The configuration changed (dledger/membership.py)."""
        self.voters = list(voters)
        self.quorum = quorum

    # ------------------------------------------------------------ watermarks
    def start_term(self, term: int) -> None:
        self.watermarks_by_term = {term: {peer: -1 for peer in self.peer_ids}}

    def update_watermark(self, term: int, peer_id: str, index: int) -> bool:
        marks = self.watermarks_by_term.get(term)
        if marks is None or index <= marks.get(peer_id, -1):
            return False
        marks[peer_id] = index
        return True

    def lower_watermark(self, term: int, peer_id: str, index: int) -> None:
        """The peer holds less than it said (it lost its disk, repairs its
        log, or is a new server under an id used before): count only `index`."""
        marks = self.watermarks_by_term.get(term)
        if marks is not None and index < marks.get(peer_id, -1):
            marks[peer_id] = index

    def forget(self, peer_id: str) -> None:
        """A server joins under this id (or moves to a new address): nothing
        it acknowledged before counts (it may be a new, empty server)."""
        for marks in self.watermarks_by_term.values():
            if peer_id in marks:
                marks[peer_id] = -1

    def watermark(self, term: int, peer_id: str) -> int:
        return self.watermarks_by_term.get(term, {}).get(peer_id, -1)

    def compute_committed(self, term: int, committed: int, term_at: Callable[[int], int]) -> int:
        marks = self.watermarks_by_term.get(term)
        if not marks:
            return committed
        return next_committed_index(committed, [marks.get(v, -1) for v in self.voters], self.quorum, term, term_at)

    # --------------------------------------------------------------- pending
    def add_pending(self, pending: PendingAppend) -> None:
        heapq.heappush(self._by_index, (pending.last_index, next(self._counter), pending))
        self._by_deadline.append(pending)
        self._pending_entries += pending.last_index - pending.first_index + 1

    def _settle(self, pending: PendingAppend) -> bool:
        """Count `pending` as finished; True when its caller still waits for an answer."""
        if pending.settled:
            return False
        pending.settled = True
        self._pending_entries -= pending.last_index - pending.first_index + 1
        return not pending.future.done()

    def complete_up_to(self, committed: int, held: list[PendingAppend] | None = None) -> int:
        """Complete, in index order, every pending append that is now
        committed; with `held`, those `after_apply` go there instead, for
        complete() once the commit has been applied."""
        done = 0
        while self._by_index and self._by_index[0][0] <= committed:
            _, _, pending = heapq.heappop(self._by_index)
            if held is not None and pending.after_apply:
                held.append(pending)
            else:
                done += self.complete([pending])
        self._drop_settled_deadlines()
        return done

    def complete(self, committed: list[PendingAppend]) -> int:
        """Answer these committed appends (taken from complete_up_to's `held`)."""
        done = 0
        for pending in committed:
            if self._settle(pending):
                pending.future.set_result((pending.first_index, pending.last_index, pending.positions))
                done += 1
        return done

    def expire(self, now: float) -> int:
        """Fail appends whose deadline passed (they may still commit later: the
        client sees an unknown outcome, as with any Raft log)."""
        expired = 0
        while self._by_deadline and self._by_deadline[0].deadline <= now:
            pending = self._by_deadline.popleft()
            if self._settle(pending):
                pending.future.set_exception(DLedgerError(
                    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
                    f"entries {pending.first_index}..{pending.last_index} not acknowledged by a quorum in time"))
                expired += 1
        if expired:
            self._by_index = [item for item in self._by_index if not item[2].settled]
            heapq.heapify(self._by_index)
        return expired

    def _drop_settled_deadlines(self) -> None:
        while self._by_deadline and self._by_deadline[0].settled:
            self._by_deadline.popleft()

    def fail_all(self, code: ResponseCode, message: str) -> None:
        pending = [item[2] for item in self._by_index]
        self._by_index, self._by_deadline = [], deque()
        self._pending_entries = 0
        for p in pending:
            if not p.future.done():
                p.future.set_exception(DLedgerError(code, message))

    def pending_entries(self) -> int:
        return self._pending_entries

    def next_deadline(self) -> float | None:
        self._drop_settled_deadlines()
        return self._by_deadline[0].deadline if self._by_deadline else None
