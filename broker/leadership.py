"""When the broker may act as the leader on its own (deliver timers, check
back transactions), and what it has started in its current term.

A leader acts on derived state (pending timers, undecided half messages) only
once its apply loop has reached the entry that opened its term: then the
state holds everything earlier leaders committed, and everything after that
point in its log is its own. Work it started in a term (a delivery whose
outcome is unknown) stays claimed until the state shows it done or the term
ends: within one term the leader never loses an entry of its own log, so
what it wrote lands unless leadership changes, and after a change the next
leader reads the outcome from the log.
"""
from __future__ import annotations

import asyncio
from collections.abc import Container

from broker.errors import BrokerError
from dledger.errors import DLedgerError, ResponseCode
from dledger.server import DLedgerServer
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.errors import PutOutcomeUnknownError, StoreError
from store.message_store import MessageStore


class LeaderGate:
    def __init__(self, server: DLedgerServer, store: MessageStore) -> None:
        self.server = server
        self.store = store

    def ready_term(self) -> int | None:
        """This node's term while it leads and has applied up to its term's
        first entry; None otherwise."""
        ready_from = self.server.leader_ready_from()
        if ready_from is None or self.store.applied_index < ready_from:
            return None
        return self.server.member_state.term


class TermClaims:
    """Keys (physical offsets) claimed by work in flight, valid for one term."""

    def __init__(self) -> None:
        self.term = -1
        self._keys: set[int] = set()

    def for_term(self, term: int) -> set[int]:
        """The claims of `term`; a new term starts with none."""
        if term != self.term:
            self.term = term
            self._keys = set()
        return self._keys

    def keep_only(self, alive: Container[int]) -> None:
        """Forget claims on work that is no longer pending (it was applied).
        Costs the number of claims, not the size of `alive`."""
        for key in [key for key in self._keys if key not in alive]:
            self._keys.discard(key)


READY_POLL_S = 0.005


async def wait_ready_term(gate: LeaderGate, timeout_s: float) -> int:
    """The ready term, waiting up to `timeout_s` for a leader just elected to
    apply its log; HA_NOT_AVAILABLE when this node does not get there (the
    client retries, and its retry is forwarded to whoever leads then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        term = gate.ready_term()
        if term is not None:
            return term
        if not gate.server.member_state.is_leader or loop.time() >= deadline:
            raise BrokerError(pb.HA_NOT_AVAILABLE, f"{gate.server.config.self_id} is not a leader ready "
                                                   "to serve this; retry")
        await asyncio.sleep(READY_POLL_S)


def nothing_written(error: BaseException) -> bool:
    """Whether a failed put or append certainly wrote nothing (so the work can
    be tried again in this term). Only an unknown outcome may have written."""
    if isinstance(error, PutOutcomeUnknownError):
        return False
    if isinstance(error, BrokerError):
        return True  # refused before anything was written
    if isinstance(error, DLedgerError):
        return error.code in (ResponseCode.NOT_LEADER, ResponseCode.LEADER_NOT_READY,
                              ResponseCode.LEADER_TRANSFERRING, ResponseCode.LEADER_PENDING_FULL)
    return isinstance(error, StoreError)
