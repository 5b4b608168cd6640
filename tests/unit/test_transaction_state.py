"""TransactionState, the undecided half messages every replica derives from
the log: fed by hand with what the apply loop would feed it."""
from __future__ import annotations

import pytest

from broker.transaction.state import (COMMIT, HALF_TOPIC, ROLLBACK, TransactionKind, TransactionState,
                                      check_payload, rollback_payload)
from store import message_const as mc
from store.codec import DispatchRequest

DEFAULT_IMMUNITY_MS = 6_000


def arrival(topic: str, offset: int, sys_flag: int, properties: dict[str, str], store_ms: int = 10_000,
            prepared_offset: int = 0) -> DispatchRequest:
    return DispatchRequest(topic=topic, queue_id=0, queue_offset=0, physical_offset=offset, msg_size=100,
                           tags_code=0, store_timestamp=store_ms, born_timestamp=store_ms, sys_flag=sys_flag,
                           flag=0, reconsume_times=0, prepared_transaction_offset=prepared_offset, body_crc=0,
                           body_offset=0, body_length=1, properties=properties)


def half(offset: int, message_id: str, immunity_s: str | None = None, store_ms: int = 10_000) -> DispatchRequest:
    properties = {mc.REAL_TOPIC: "Orders", mc.REAL_QUEUE_ID: "2", mc.UNIQ_KEY: message_id,
                  mc.TRANSACTION_PREPARED: "true"}
    if immunity_s is not None:
        properties[mc.CHECK_IMMUNITY_TIME_IN_SECONDS] = immunity_s
    return arrival(HALF_TOPIC, offset, mc.TRANSACTION_PREPARED_TYPE, properties, store_ms)


def committed(half_offset: int, message_id: str, offset: int = 90_000) -> DispatchRequest:
    return arrival("Orders", offset, mc.TRANSACTION_COMMIT_TYPE, {mc.UNIQ_KEY: message_id},
                   prepared_offset=half_offset)


@pytest.fixture
def state(tmp_path) -> TransactionState:
    return TransactionState(str(tmp_path), DEFAULT_IMMUNITY_MS)


def test_a_half_message_is_first_checked_after_its_recovery_time_or_the_default(state: TransactionState):
    state.on_arrival(half(1, "a", immunity_s="2"), index=1)
    state.on_arrival(half(2, "b"), index=2)
    state.on_arrival(half(3, "c", immunity_s="garbage"), index=3)
    assert state.get(1).next_check_ms == 12_000
    assert state.get(2).next_check_ms == 16_000 == state.get(3).next_check_ms
    assert (state.get(1).topic, state.get(1).queue_id) == ("Orders", 2)


def test_the_commit_copy_decides_its_half_message_only_when_the_message_ids_agree(state: TransactionState):
    state.on_arrival(half(1, "a"), index=1)
    state.on_arrival(half(2, "b"), index=2)
    state.on_arrival(committed(1, "not-a"), index=3)
    state.on_arrival(committed(2, "b"), index=4)
    assert list(state.halves) == [1]
    assert state.outcome(2).resolution == COMMIT and state.outcome(1) is None


def test_a_rollback_entry_decides_and_remembers_why(state: TransactionState):
    state.on_arrival(half(1, "a"), index=1)
    state.apply(2, TransactionKind.ROLLBACK, rollback_payload([state.get(1)], "max-checks"))
    assert not state.halves
    assert (state.outcome(1).resolution, state.outcome(1).reason) == (ROLLBACK, "max-checks")


def test_each_check_entry_counts_once_and_sets_the_next_check_on_every_replica_alike(state: TransactionState):
    state.on_arrival(half(1, "a", immunity_s="1"), index=1)
    state.apply(2, TransactionKind.CHECK, check_payload([state.get(1)], checked_ms=11_500, interval_ms=30_000))
    state.apply(3, TransactionKind.CHECK, check_payload([state.get(1)], checked_ms=41_600, interval_ms=30_000))
    assert (state.get(1).check_times, state.get(1).next_check_ms) == (2, 71_600)
    state.apply(3, TransactionKind.CHECK, check_payload([state.get(1)], checked_ms=41_600, interval_ms=30_000))
    assert state.get(1).check_times == 2  # the same entry replayed after a restart


def test_half_messages_due_for_a_check_come_longest_waiting_first_leaving_out_those_being_ended(
        state: TransactionState):
    for index, (offset, store_ms) in enumerate([(1, 3_000), (2, 1_000), (3, 2_000), (4, 50_000)], start=1):
        state.on_arrival(half(offset, f"m{offset}", immunity_s="0", store_ms=store_ms), index)
    assert [h.offset for h in state.due_for_check(10_000, limit=10)] == [2, 3, 1]
    assert [h.offset for h in state.due_for_check(10_000, limit=10, exclude={3})] == [2, 1]
    assert [h.offset for h in state.due_for_check(10_000, limit=1)] == [2]


def test_the_snapshot_brings_back_halves_counts_and_outcomes(state: TransactionState, tmp_path):
    state.on_arrival(half(1, "a"), index=1)
    state.on_arrival(half(2, "b"), index=2)
    state.apply(3, TransactionKind.CHECK, check_payload([state.get(1)], 20_000, 1_000))
    state.on_arrival(committed(2, "b"), index=4)
    assert state.persist()
    restored = TransactionState(str(tmp_path), DEFAULT_IMMUNITY_MS)
    restored.load()
    assert restored.applied_index == 4
    assert (restored.get(1).check_times, restored.get(1).next_check_ms) == (1, 21_000)
    assert restored.outcome(2).resolution == COMMIT


def test_a_capture_holds_the_halves_as_of_its_capture(state: TransactionState):
    # It is encoded in the writer's thread while checks and commits apply.
    state.on_arrival(half(1, "a"), index=1)
    state.on_arrival(half(2, "b"), index=2)
    capture = state.capture()
    expected = state.encode()
    state.apply(3, TransactionKind.CHECK, check_payload([state.get(1)], 20_000, 1_000))
    state.on_arrival(committed(2, "b"), index=4)
    assert capture() == expected != state.encode()


def test_undecided_halves_are_rows_the_garbage_collector_leaves_alone(state: TransactionState, tmp_path):
    # A full collection runs on the event loop and walks every object it
    # tracks: 300,000 undecided halves as objects cost each one 61 ms.
    import gc
    for offset in range(1, 101):
        state.on_arrival(half(offset, f"id{offset}"), index=offset)
    state.apply(101, TransactionKind.CHECK, check_payload([state.get(7)], checked_ms=20_000, interval_ms=60_000))
    state.persist(force=True)
    loaded = TransactionState(str(tmp_path), DEFAULT_IMMUNITY_MS)
    loaded.load()
    gc.collect()
    for held in (state, loaded):
        assert len(held.halves) == 100 and not gc.is_tracked(held.halves)
        assert (held.get(7).check_times, held.get(7).next_check_ms) == (1, 80_000)
        assert [h.offset for h in held.due_for_check(16_000, 3)] == [1, 2, 3] and held.oldest_index() == 1
