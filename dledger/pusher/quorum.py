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
import logging
from collections import OrderedDict
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
    first_index: int
    last_index: int
    positions: list[int]
    started: float
    deadline: float
    future: asyncio.Future[tuple[int, int, list[int]]] = field(repr=False)


class QuorumAckChecker:
    def __init__(self, self_id: str, peer_ids: list[str], quorum: int) -> None:
        self.self_id = self_id
        self.peer_ids = peer_ids
        self.quorum = quorum
        self.watermarks_by_term: dict[int, dict[str, int]] = {}
        self.pending: OrderedDict[int, PendingAppend] = OrderedDict()  # by last index
        self._pending_entries = 0

    # ------------------------------------------------------------ watermarks
    def start_term(self, term: int) -> None:
        self.watermarks_by_term = {term: {peer: -1 for peer in self.peer_ids}}

    def update_watermark(self, term: int, peer_id: str, index: int) -> bool:
        marks = self.watermarks_by_term.get(term)
        if marks is None or index <= marks.get(peer_id, -1):
            return False
        marks[peer_id] = index
        return True

    def watermark(self, term: int, peer_id: str) -> int:
        return self.watermarks_by_term.get(term, {}).get(peer_id, -1)

    def compute_committed(self, term: int, committed: int, term_at: Callable[[int], int]) -> int:
        marks = self.watermarks_by_term.get(term)
        if not marks:
            return committed
        return next_committed_index(committed, list(marks.values()), self.quorum, term, term_at)

    # --------------------------------------------------------------- pending
    def add_pending(self, pending: PendingAppend) -> None:
        self.pending[pending.last_index] = pending
        self._pending_entries += pending.last_index - pending.first_index + 1

    def complete_up_to(self, committed: int) -> int:
        """Complete, in index order, every pending append that is now committed."""
        done = 0
        while self.pending:
            last, pending = next(iter(self.pending.items()))
            if last > committed:
                break
            self.pending.popitem(last=False)
            self._pending_entries -= last - pending.first_index + 1
            if not pending.future.done():
                pending.future.set_result((pending.first_index, pending.last_index, pending.positions))
            done += 1
        return done

    def expire(self, now: float) -> int:
        """Fail appends whose deadline passed (they may still commit later: the
        client sees an unknown outcome, as with any Raft log)."""
        expired = [last for last, p in self.pending.items() if p.deadline <= now]
        for last in expired:
            pending = self.pending.pop(last)
            self._pending_entries -= last - pending.first_index + 1
            if not pending.future.done():
                pending.future.set_exception(DLedgerError(
                    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
                    f"entries {pending.first_index}..{pending.last_index} not acknowledged by a quorum in time"))
        return len(expired)

    def fail_all(self, code: ResponseCode, message: str) -> None:
        pending, self.pending = self.pending, OrderedDict()
        self._pending_entries = 0
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(DLedgerError(code, message))

    def pending_entries(self) -> int:
        return self._pending_entries

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self.pending.values()), default=None)
