"""ReadIndex (Raft thesis §6.4): reads that never see a deposed leader's past.

A leader cut off from the others keeps answering until its check-quorum
timer fires, and in that gap a new leader may commit entries it has never
seen. So before a read is served, the leader proves it still leads: a round
of heartbeats, sent after the read arrived, answered by a majority in its
term. Reads arriving while a round is in flight wait for the next one, so
one round serves every read that queued behind it, and a steady stream of
reads costs a round trip per batch, not per read.

(The leader also has an entry of its own term committed before it serves
anything: the pusher's readiness, checked by the caller.)
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState

# (peer, term) -> whether the peer acknowledged our leadership of `term`
Heartbeat = Callable[[str, int], Awaitable[bool]]
# The voters to ask (this node excluded) and how many of them must confirm,
# both read at each round: the membership may change between rounds.
Voters = Callable[[], list[str]]
AcksNeeded = Callable[[], int]


class ReadIndex:
    def __init__(self, member_state: MemberState, peers: Voters, acks_needed: AcksNeeded, heartbeat: Heartbeat,
                 timeout_s: float) -> None:
        self.member_state = member_state
        self.peers = peers
        self.acks_needed = acks_needed
        self.heartbeat = heartbeat
        self.timeout_s = timeout_s
        self.rounds = 0   # rounds started so far (a metric, and how reads tell rounds apart)
        self._round: asyncio.Task[bool] | None = None

    async def confirm(self) -> None:
        """Return once a majority confirmed, after this call began, that this
        node leads its current term; NOT_LEADER otherwise."""
        term = self.member_state.term
        acceptable = self.rounds + 1   # only a round that starts from now on
        while True:
            if self._round is None or self._round.done():
                self.rounds += 1
                self._round = asyncio.get_running_loop().create_task(self._run_round(term))
            number, round_ = self.rounds, self._round
            confirmed = await asyncio.shield(round_)
            if number >= acceptable:
                break
        if not confirmed or self.member_state.term != term or not self.member_state.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER,
                               f"{self.member_state.self_id} could not confirm its leadership of term {term} "
                               f"with a majority; ask the current leader")

    async def _run_round(self, term: int) -> bool:
        needed = self.acks_needed()   # this node, a voter, counts for itself
        if needed <= 0:
            return True
        pending = {asyncio.ensure_future(self.heartbeat(peer, term)) for peer in self.peers()}
        acks = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    acks += sum(1 for task in done if not task.cancelled() and task.exception() is None
                                and task.result())
                    if acks >= needed:
                        return True
        except TimeoutError:
            pass
        finally:
            for task in pending:
                task.cancel()
        return False
