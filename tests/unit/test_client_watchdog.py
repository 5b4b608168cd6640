"""The client's leader watchdog (broker/client/watchdog.py): when it asks
whether the leader moved, what counts as a move, and that a call waiting on
a leader that moved is given up (to be tried again at the new one) while
one that was answered is left alone."""
from __future__ import annotations

import asyncio

import pytest

from broker.client.watchdog import LeaderWatchdog, Waiting, due, leader_elsewhere
from rpcgen import dledger_pb2


def waiting(address: str, started: float, long_poll: bool = False) -> Waiting:
    return Waiting(address, started, long_poll, None)


def test_a_unary_call_is_due_a_check_sooner_than_a_long_poll_and_only_on_the_leader():
    calls = [waiting("a", 10.0), waiting("a", 10.0, long_poll=True), waiting("b", 0.0)]
    assert not due(calls, "a", 10.4, 0.5)
    assert due(calls, "a", 10.5, 0.5)
    assert not due([calls[1]], "a", 10.9, 0.5) and due([calls[1]], "a", 11.0, 0.5)
    assert not due([calls[2]], "a", 99.0, 0.5)   # waiting on another node: not the leader's


def metadata(role: str, term: int, leader: str = "") -> dledger_pb2.MetadataResponse:
    return dledger_pb2.MetadataResponse(role=role, term=term, leader_address=leader)


@pytest.mark.parametrize("answers, found", [
    ([("b", metadata("FOLLOWER", 3, "a")), ("c", metadata("FOLLOWER", 3, "a"))], None),  # still follow the old
    ([("b", metadata("CANDIDATE", 4)), ("c", None)], None),                                # an election: no one yet
    ([("b", metadata("LEADER", 4)), ("c", None)], ("b", 4)),                               # b leads now
    ([("b", metadata("FOLLOWER", 4, "c")), ("c", object())], ("c", 4)),                    # b follows c
    ([("b", metadata("FOLLOWER", 4, "a"))], None),                                         # a elected again: stay
    ([("b", metadata("LEADER", 3))], None),                                                # not a later term
])
def test_only_a_later_term_with_another_leader_counts_as_a_move(answers, found):
    assert leader_elsewhere(answers, "a", 3) == found


async def test_a_call_waiting_on_a_leader_that_moved_is_given_up_but_a_finished_one_is_not():
    probes = {"b": metadata("FOLLOWER", 3, "a")}

    async def probe(address: str) -> object:
        return probes.get(address)

    moved: list[tuple[str, int]] = []
    watchdog = LeaderWatchdog(probe, lambda: ["a", "b"], after_s=0.05)
    watchdog.leader, watchdog.term = "a", 3
    watchdog.on_moved = lambda address, term: moved.append((address, term))
    stalled = asyncio.get_running_loop().create_future()

    async def call() -> str:
        with watchdog.watch("a", long_poll=False) as watch:
            try:
                await stalled          # a paused leader: no answer
            except asyncio.CancelledError:
                assert watch.given_up
                return "given up"
        return "answered"

    async def quick() -> str:
        with watchdog.watch("a", long_poll=False):
            return "answered"

    task = asyncio.ensure_future(call())
    assert await quick() == "answered"
    await asyncio.sleep(0.2)
    assert not task.done() and moved == []     # the followers still name the old leader
    probes["b"] = metadata("LEADER", 4)
    assert await asyncio.wait_for(task, 2) == "given up"
    assert moved == [("b", 4)] and watchdog.moves == 1
    await watchdog.close()
