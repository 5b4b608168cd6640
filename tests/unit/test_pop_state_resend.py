"""The pop state's `resend` op (an operator's resend of one consumed message
to one group): it takes effect only for a message the group got past and has
no lease or block on, and the next receive delivers it as attempt 1."""
from __future__ import annotations

import pytest

from broker.consumer.pop_state import ATTEMPT, AckOp, PopStateManager, ResendOp, decode_op
from tests.unit.test_pop_state import NOW, G, T, apply, messages, pop


@pytest.fixture
def state(tmp_path) -> PopStateManager:
    return PopStateManager(str(tmp_path))


def test_a_resent_message_is_delivered_again_as_attempt_one(state):
    source = messages(10)
    assert pop(state, 10, source) == [0, 1, 2, 3]
    apply(state, 11, AckOp(G, T, 0, [(o, 10) for o in range(4)]))
    assert state.queue(G, T, 0).consumed_offset() == 4
    apply(state, 12, ResendOp(G, T, 0, 2))
    lease = state.lease_of(G, T, 0, 2)
    assert (lease.lease, lease.deadline_ms, lease.attempt) == (12, 0, 0)
    assert state.queue(G, T, 0).consumed_offset() == 2      # outstanding again until acked
    assert pop(state, 13, source, now=NOW) == [2, 4, 5, 6]
    assert state.lease_of(G, T, 0, 2).attempt == 1


def test_a_resend_of_a_message_not_yet_delivered_or_in_flight_does_nothing(state):
    source = messages(10)
    pop(state, 10, source)                                   # 0..3 in flight, 4.. not delivered
    apply(state, 11, ResendOp(G, T, 0, 1))
    assert state.lease_of(G, T, 0, 1).lease == 10            # the lease in flight stays
    apply(state, 12, ResendOp(G, T, 0, 7))
    assert state.lease_of(G, T, 0, 7) is None                # the scan will deliver it anyway


def test_a_resend_to_a_group_that_never_popped_the_queue_starts_it_where_it_stands(state):
    apply(state, 10, ResendOp(G, T, 0, 3, initial=5))
    queue = state.queue(G, T, 0)
    assert queue.pop_offset == 5 and queue.in_flight[3][ATTEMPT] == 0


def test_the_op_survives_its_json_round_trip():
    op = ResendOp(G, T, 1, 7, message_group="orders-1", initial=3)
    assert decode_op(op.to_json()) == op
