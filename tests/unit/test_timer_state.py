"""TimerState, the pending timers every replica derives from the log: fed by
hand with what the apply loop would feed it, no sockets, no clock."""
from __future__ import annotations

import gc
import json

import pytest

from broker.timer.levels import DelayLevels
from broker.timer.state import SCHEDULE_TOPIC, TIMER_TOPIC, Timer, TimerKind, TimerState, cancel_payload
from store import message_const as mc
from store.codec import DispatchRequest

LEVELS = DelayLevels.parse("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")


def arrival(topic: str, offset: int, properties: dict[str, str], store_ms: int = 1_000) -> DispatchRequest:
    return DispatchRequest(topic=topic, queue_id=0, queue_offset=0, physical_offset=offset, msg_size=100,
                           tags_code=0, store_timestamp=store_ms, born_timestamp=store_ms, sys_flag=0, flag=0,
                           reconsume_times=0, prepared_transaction_offset=0, body_crc=0, body_offset=0,
                           body_length=1, properties=properties)


def timed(offset: int, due_ms: int, message_id: str = "", topic: str = "T", queue: int = 0) -> DispatchRequest:
    return arrival(TIMER_TOPIC, offset, {mc.TIMER_DELIVER_MS: str(due_ms), mc.REAL_TOPIC: topic,
                                         mc.REAL_QUEUE_ID: str(queue), mc.UNIQ_KEY: message_id or f"id{offset}"})


def delivered(origin: int, message_id: str, offset: int = 10_000) -> DispatchRequest:
    return arrival("T", offset, {mc.TIMER_ORIGIN_OFFSET: str(origin), mc.UNIQ_KEY: message_id})


@pytest.fixture
def state(tmp_path) -> TimerState:
    return TimerState(str(tmp_path), LEVELS)


def test_a_timed_message_is_due_at_its_delivery_time_and_never_before(state: TimerState):
    assert state.on_arrival(timed(100, due_ms=5_000, topic="Orders", queue=3), index=1)
    assert state.due(4_999, limit=10) == []
    [timer] = state.due(5_000, limit=10)
    assert (timer.offset, timer.topic, timer.queue_id, timer.message_id) == (100, "Orders", 3, "id100")


def test_a_level_message_without_a_delivery_time_is_due_its_levels_delay_after_it_was_stored(state: TimerState):
    state.on_arrival(arrival(SCHEDULE_TOPIC, 7, {mc.DELAY_TIME_LEVEL: "3", mc.REAL_TOPIC: "T",
                                                 mc.UNIQ_KEY: "a"}, store_ms=1_000), index=1)
    assert state.next_due_ms() == 11_000  # level 3 is 10 s


def test_due_timers_come_earliest_first_up_to_the_limit_leaving_out_claimed_ones(state: TimerState):
    for index, (offset, due) in enumerate([(1, 300), (2, 100), (3, 200), (4, 900)], start=1):
        state.on_arrival(timed(offset, due), index)
    assert [t.offset for t in state.due(500, limit=10)] == [2, 3, 1]
    assert [t.offset for t in state.due(500, limit=2)] == [2, 3]
    assert [t.offset for t in state.due(500, limit=10, exclude={3})] == [2, 1]
    # Asking does not consume: the same answer again until they are delivered.
    assert [t.offset for t in state.due(500, limit=10)] == [2, 3, 1]


def test_the_delivered_copy_marks_its_timer_done_only_when_the_message_ids_agree(state: TimerState):
    state.on_arrival(timed(1, 100, "m1"), index=1)
    state.on_arrival(timed(2, 100, "m2"), index=2)
    state.on_arrival(delivered(origin=1, message_id="someone-else"), index=3)
    state.on_arrival(delivered(origin=2, message_id="m2"), index=4)
    assert [t.offset for t in state.due(1_000, limit=10)] == [1]
    assert state.applied_index == 4


def test_a_cancel_entry_removes_its_timers(state: TimerState):
    state.on_arrival(timed(1, 100, "m1"), index=1)
    state.on_arrival(timed(2, 200, "m2"), index=2)
    timer = state.get(1)
    assert timer is not None
    state.apply(3, TimerKind.CANCEL, cancel_payload([timer], "recall"))
    assert list(state.pending) == [2] and state.next_due_ms() == 200


def test_a_replayed_arrival_after_a_restart_changes_nothing(state: TimerState):
    state.on_arrival(timed(1, 100, "m1"), index=5)
    state.on_arrival(delivered(1, "m1"), index=6)
    assert not state.on_arrival(timed(1, 100, "m1"), index=5)  # the apply loop replays from its checkpoint
    assert len(state) == 0


def test_a_malformed_timer_message_is_skipped_rather_than_stopping_the_apply_loop(state: TimerState):
    assert not state.on_arrival(arrival(TIMER_TOPIC, 1, {mc.TIMER_DELIVER_MS: "soon"}), index=1)
    assert len(state) == 0 and state.applied_index == 1


def test_the_snapshot_brings_back_every_pending_timer_in_due_order(state: TimerState, tmp_path):
    for index, (offset, due) in enumerate([(10, 3_000), (20, 1_000), (30, 2_000)], start=1):
        state.on_arrival(timed(offset, due), index)
    state.on_arrival(delivered(30, "id30"), index=4)
    assert state.persist()
    restored = TimerState(str(tmp_path), LEVELS)
    restored.load()
    assert restored.applied_index == 4 and restored.oldest_index() == 1
    assert [(t.offset, t.due_ms) for t in restored.due(10_000, limit=10)] == [(20, 1_000), (10, 3_000)]
    assert json.loads(open(restored.path).read())["timers"]["count"] == 2


def test_a_file_with_one_row_per_timer_still_loads(tmp_path):
    # timers.json as written before timers were packed in columns.
    rows = [[20, 1_000, "id20", "Real", 3, 2], [10, 3_000, "id10", "Other", 0, 1]]
    (tmp_path / "timers.json").write_text(json.dumps({"appliedIndex": 2, "timers": rows}))
    restored = TimerState(str(tmp_path), LEVELS)
    restored.load()
    assert list(restored.pending) == [10, 20] and restored.oldest_index() == 1
    assert restored.get(20) == Timer(20, 1_000, "id20", "Real", 3, 2)


def test_a_capture_holds_the_timers_as_of_its_capture(state: TimerState):
    for index in range(1, 1001):
        state.on_arrival(timed(index * 100, 5_000 + index), index)
    capture = state.capture()
    expected = state.encode()
    state.on_arrival(delivered(100, "id100"), index=1001)
    state.on_arrival(timed(999_999, 1), 1002)
    assert capture() == expected != state.encode()


def test_a_follower_that_never_asks_keeps_its_index_bounded(state: TimerState):
    for i in range(5_000):
        state.on_arrival(timed(i, 1_000 + i), 2 * i + 1)
        state.on_arrival(delivered(i, f"id{i}"), 2 * i + 2)
    assert len(state) == 0
    assert len(state._heap) <= 1024 + 1


@pytest.mark.parametrize("level, expected", [(1, 1_000), (18, 7_200_000), (19, 7_200_000), (99, 7_200_000)])
def test_delay_levels_are_rocketmqs_and_a_level_beyond_the_last_is_the_last(level, expected):
    assert LEVELS.delay_ms(level) == expected


def test_delay_levels_refuse_notation_they_cannot_read():
    with pytest.raises(ValueError):
        DelayLevels.parse("1s 5x")


def test_pending_timers_are_not_walked_by_the_garbage_collector(state: TimerState):
    # A full collection walks every tracked object: a million pending timers
    # held as objects made each one a stall of the event loop (a leader's
    # heartbeats late). Held as plain tuples, the collector drops them.
    for index in range(1, 1_001):
        state.on_arrival(timed(index, 100 + index), index)
    gc.collect()
    assert not any(gc.is_tracked(row) for row in state.pending.values())
    assert state.get(5) == Timer(5, 105, "id5", "T", 0, 5)
