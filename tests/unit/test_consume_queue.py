"""ConsumeQueue: 20-byte units in fixed-size files, dense offsets, replay, recovery, retention."""
from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest

from store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue, CqUnit, GetStatus
from store.consume_queue_store import ConsumeQueueStore
from store.errors import ConsumeQueueError, CorruptFileError
from store.java_hash import tag_hash_code

UNITS_PER_FILE = 4  # 80-byte files: rolling is easy to reach
TAG_A = tag_hash_code("TagA")
TAG_B = tag_hash_code("TagB")


def unit(n: int, tag: int = 0) -> tuple[int, int, int]:
    """The n-th message's unit: commit log offsets grow with n."""
    return (1000 + n * 100, 90 + n, tag)


def open_queue(tmp_path: Path, **kwargs: object) -> ConsumeQueue:
    return ConsumeQueue.open(str(tmp_path), "TopicTest", 0, units_per_file=UNITS_PER_FILE, **kwargs)  # type: ignore[arg-type]


def filled(tmp_path: Path, count: int) -> ConsumeQueue:
    queue = open_queue(tmp_path)
    queue.put_batch(0, [unit(n, TAG_A if n % 2 == 0 else TAG_B) for n in range(count)])
    return queue


def file_names(queue: ConsumeQueue) -> list[str]:
    return sorted(os.listdir(queue.directory))


def snapshot(queue: ConsumeQueue) -> dict[str, bytes]:
    return {name: Path(queue.directory, name).read_bytes() for name in file_names(queue)}


# --- put and get ---------------------------------------------------------------


def test_units_are_20_bytes_big_endian_at_offset_times_20(tmp_path: Path):
    queue = open_queue(tmp_path)
    assert queue.put(0, 4096, 300, -5) is True
    assert queue.put(1, 8192, 301, TAG_A) is True
    raw = Path(queue.directory, "0" * 20).read_bytes()
    assert len(raw) == UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
    assert struct.unpack_from(">qiq", raw, 0) == (4096, 300, -5)
    assert struct.unpack_from(">qiq", raw, 20) == (8192, 301, TAG_A)
    assert raw[40:] == bytes(40)


def test_get_returns_units_from_an_offset(tmp_path: Path):
    queue = filled(tmp_path, 10)
    result = queue.get(3, 4)
    assert result.status is GetStatus.FOUND
    assert result.units == [CqUnit(n, *unit(n, TAG_A if n % 2 == 0 else TAG_B)) for n in range(3, 7)]
    assert result.next_offset == 7
    assert (result.min_offset, result.max_offset) == (0, 10)
    assert queue.last_unit() == CqUnit(9, *unit(9, TAG_B))


def test_get_filters_by_tag_hash_and_bounds_the_scan(tmp_path: Path):
    queue = filled(tmp_path, 10)
    result = queue.get(0, 3, {TAG_B})
    assert [u.queue_offset for u in result.units] == [1, 3, 5]
    assert result.next_offset == 6
    # Only 2 units may be looked at: both are TagA, so nothing matches, and the
    # consumer goes on from past them.
    result = queue.get(2, 1, {tag_hash_code("TagC")}, max_scan=2)
    assert result.status is GetStatus.NO_MATCHED_MESSAGE and result.units == []
    assert result.next_offset == 4


def test_get_answers_offsets_outside_the_queue(tmp_path: Path):
    queue = open_queue(tmp_path)
    assert queue.get(0, 1).status is GetStatus.NO_MESSAGE_IN_QUEUE
    queue.put_batch(0, [unit(n) for n in range(3)])
    at_end = queue.get(3, 1)
    assert (at_end.status, at_end.next_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 3)
    past_end = queue.get(9, 1)
    assert (past_end.status, past_end.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 3)
    with pytest.raises(ValueError, match="max_count"):
        queue.get(0, 0)


def test_get_across_files_reads_every_unit(tmp_path: Path):
    queue = filled(tmp_path, 11)
    result = queue.get(2, 100)
    assert [u.queue_offset for u in result.units] == list(range(2, 11))
    assert [u.phys_offset for u in result.units] == [unit(n)[0] for n in range(2, 11)]


# --- the dense-offset rule -----------------------------------------------------


def test_a_gap_above_the_end_is_refused_and_writes_nothing(tmp_path: Path):
    queue = filled(tmp_path, 3)
    before = snapshot(queue)
    with pytest.raises(ConsumeQueueError, match="queue offset 4 would leave a gap: the queue ends at 3"):
        queue.put(4, *unit(4))
    assert queue.max_offset == 3 and snapshot(queue) == before


def test_replaying_a_stored_unit_is_a_no_op(tmp_path: Path):
    queue = filled(tmp_path, 5)
    before = snapshot(queue)
    assert queue.put(2, *unit(2, TAG_A)) is False
    assert queue.put_batch(3, [unit(3, TAG_B), unit(4, TAG_A), unit(5), unit(6)]) == 2
    assert queue.max_offset == 7
    assert snapshot(queue)[("0" * 20)] == before["0" * 20]


def test_a_different_unit_over_a_stored_one_is_refused(tmp_path: Path):
    queue = filled(tmp_path, 5)
    before = snapshot(queue)
    with pytest.raises(ConsumeQueueError, match="queue offset 2 already holds unit"):
        queue.put(2, unit(2)[0], 999, TAG_A)
    # A batch whose replayed part disagrees appends nothing either.
    with pytest.raises(ConsumeQueueError, match="queue offset 4 already holds"):
        queue.put_batch(4, [unit(4, TAG_B), unit(5), unit(6)])
    assert queue.max_offset == 5 and snapshot(queue) == before


def test_commit_log_offsets_must_increase(tmp_path: Path):
    queue = filled(tmp_path, 2)
    with pytest.raises(ConsumeQueueError, match="not above the previous unit's"):
        queue.put(2, unit(1)[0], 10, 0)
    with pytest.raises(ConsumeQueueError, match="not above"):
        queue.put_batch(2, [unit(5), unit(4)])
    assert queue.max_offset == 2


@pytest.mark.parametrize("bad, reason", [
    ((0, 10, 0), "commit log offset 0"),
    ((100, 0, 0), "message size 0"),
    ((100, 1 << 31, 0), "message size"),
    ((100, 10, 1 << 63), "tag hash"),
])
def test_bad_unit_values_are_refused(tmp_path: Path, bad: tuple[int, int, int], reason: str):
    queue = open_queue(tmp_path)
    with pytest.raises(ConsumeQueueError, match=reason):
        queue.put(0, *bad)
    assert queue.max_offset == 0 and not os.path.exists(queue.directory)


# --- files and recovery ----------------------------------------------------------


def test_rolling_creates_files_named_by_their_start_byte_offset(tmp_path: Path):
    queue = filled(tmp_path, 9)
    assert file_names(queue) == ["00000000000000000000", "00000000000000000080", "00000000000000000160"]


def test_restart_finds_the_end(tmp_path: Path):
    queue = filled(tmp_path, 6)
    queue.flush()
    queue.close()
    reopened = open_queue(tmp_path)
    assert (reopened.min_offset, reopened.max_offset) == (0, 6)
    assert reopened.last_unit() == CqUnit(5, *unit(5, TAG_B))
    assert reopened.put(6, *unit(6)) is True


def test_restart_with_a_full_last_file_ends_at_the_file_end(tmp_path: Path):
    filled(tmp_path, 8).close()
    reopened = open_queue(tmp_path)
    assert reopened.max_offset == 8
    reopened.put(8, *unit(8))
    assert file_names(reopened)[-1] == "00000000000000000160"


def test_restart_cuts_a_torn_last_unit(tmp_path: Path):
    queue = filled(tmp_path, 6)
    queue.close()
    path = Path(queue.directory, "00000000000000000080")
    # Half of unit 6 reached the disk before the crash.
    with open(path, "r+b") as f:
        f.seek(2 * CQ_STORE_UNIT_SIZE)
        f.write(struct.pack(">qiq", *unit(6))[:11])
    reopened = open_queue(tmp_path)
    assert reopened.max_offset == 6
    assert path.read_bytes()[2 * CQ_STORE_UNIT_SIZE:] == bytes(2 * CQ_STORE_UNIT_SIZE)
    assert reopened.put(6, *unit(6, TAG_A)) is True
    assert reopened.unit_at(6) == CqUnit(6, *unit(6, TAG_A))


def test_restart_ends_at_a_hole_and_drops_later_files(tmp_path: Path):
    queue = filled(tmp_path, 10)
    queue.close()
    # Unit 5 never reached the disk, units after it did (written out of order).
    with open(Path(queue.directory, "00000000000000000080"), "r+b") as f:
        f.seek(1 * CQ_STORE_UNIT_SIZE)
        f.write(bytes(CQ_STORE_UNIT_SIZE))
    reopened = open_queue(tmp_path)
    assert reopened.max_offset == 5
    assert file_names(reopened) == ["00000000000000000000", "00000000000000000080"]
    assert reopened.get(0, 100).units[-1].queue_offset == 4


def test_a_file_of_the_wrong_size_is_refused(tmp_path: Path):
    queue = filled(tmp_path, 2)
    queue.close()
    with open(Path(queue.directory, "0" * 20), "ab") as f:
        f.write(b"\0")
    with pytest.raises(CorruptFileError, match="expected exactly 80"):
        open_queue(tmp_path)


# --- truncation and retention ----------------------------------------------------


def test_truncate_from_phys_drops_units_at_and_past_the_offset(tmp_path: Path):
    queue = filled(tmp_path, 10)
    dropped = queue.truncate_from_phys(unit(5)[0] - 1)  # between units 4 and 5
    assert dropped == 5 and queue.max_offset == 5
    assert file_names(queue) == ["00000000000000000000", "00000000000000000080"]
    assert queue.truncate_from_phys(unit(9)[0]) == 0
    queue.close()
    reopened = open_queue(tmp_path)
    assert reopened.max_offset == 5
    assert reopened.put(5, *unit(5)) is True  # the apply loop carries on from there


def test_truncate_from_phys_below_everything_empties_the_queue(tmp_path: Path):
    queue = filled(tmp_path, 6)
    assert queue.truncate_from_phys(1) == 6
    assert queue.max_offset == 0 and queue.get(0, 1).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert file_names(queue) == ["0" * 20] and Path(queue.directory, "0" * 20).read_bytes() == bytes(80)
    assert queue.put(0, *unit(0)) is True


def test_delete_before_phys_deletes_whole_files_and_moves_the_minimum(tmp_path: Path):
    queue = filled(tmp_path, 11)
    deleted = queue.delete_before_phys(unit(6)[0])  # units 0..5 are below it
    assert deleted == 1
    assert file_names(queue) == ["00000000000000000080", "00000000000000000160"]
    assert queue.min_offset == 6
    moved = queue.get(2, 5)
    assert (moved.status, moved.next_offset) == (GetStatus.OFFSET_TOO_SMALL, 6)
    assert queue.get(6, 1).units[0].queue_offset == 6
    with pytest.raises(ConsumeQueueError, match="below the minimum 6"):
        queue.put(5, *unit(5))


def test_delete_before_phys_never_deletes_the_last_file(tmp_path: Path):
    queue = filled(tmp_path, 6)
    assert queue.delete_before_phys(unit(100)[0]) == 1
    assert file_names(queue) == ["00000000000000000080"]
    assert (queue.min_offset, queue.max_offset) == (6, 6)
    assert queue.put(6, *unit(6)) is True


def test_reopen_with_the_log_minimum_restores_the_minimum(tmp_path: Path):
    queue = filled(tmp_path, 11)
    queue.delete_before_phys(unit(6)[0])
    queue.close()
    assert open_queue(tmp_path).min_offset == 4  # the first file's first unit
    assert open_queue(tmp_path, min_phys_offset=unit(6)[0]).min_offset == 6


# --- the store of all queues -------------------------------------------------------


def test_store_loads_every_queue_and_applies_store_wide_operations(tmp_path: Path):
    store = ConsumeQueueStore.open(str(tmp_path), units_per_file=UNITS_PER_FILE)
    for topic in ("TopicA", "%RETRY%group_1"):
        for queue_id in (0, 1):
            store.find_or_create(topic, queue_id).put_batch(0, [unit(n) for n in range(5)])
    assert store.find_or_create("TopicA", 1) is store.get("TopicA", 1)
    assert store.flush() == 8  # two files in each of four queues
    assert store.flush() == 0
    store.close()

    reopened = ConsumeQueueStore.open(str(tmp_path), units_per_file=UNITS_PER_FILE)
    assert len(reopened) == 4 and reopened.topics() == {"TopicA", "%RETRY%group_1"}
    assert all(queue.max_offset == 5 for queue in reopened)
    assert reopened.truncate_from_phys(unit(3)[0]) == 8
    assert reopened.delete_topic("TopicA") == 2
    assert not os.path.exists(tmp_path / "consumequeue" / "TopicA")
    assert reopened.get("TopicA", 0) is None and len(reopened) == 2


@pytest.mark.parametrize("topic", ["", "../etc", "a/b", "x" * 256, "tab\tname"])
def test_store_refuses_illegal_topic_names(tmp_path: Path, topic: str):
    store = ConsumeQueueStore.open(str(tmp_path))
    with pytest.raises(ConsumeQueueError, match="illegal topic"):
        store.find_or_create(topic, 0)
    with pytest.raises(ConsumeQueueError, match="illegal topic"):
        store.delete_topic(topic)


def test_flush_from_a_worker_thread_while_putting(tmp_path: Path):
    store = ConsumeQueueStore.open(str(tmp_path), units_per_file=UNITS_PER_FILE)
    queue = store.find_or_create("TopicA", 0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                store.flush()
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=flusher)
    thread.start()
    for n in range(200):
        queue.put(n, *unit(n))
        if n % 50 == 49:
            queue.delete_before_phys(unit(n - 10)[0])
    stop.set()
    thread.join()
    assert errors == [] and queue.max_offset == 200


def test_a_queue_restarted_above_zero_keeps_its_minimum_across_reopening(tmp_path: Path):
    queue = open_queue(tmp_path)
    queue.put_batch(0, [unit(n) for n in range(3)])
    queue.restart_at(7)                      # its log now starts with this queue at offset 7
    assert (queue.min_offset, queue.max_offset) == (7, 7)
    queue.put_batch(7, [unit(n) for n in range(100, 106)])
    queue.close()
    reopened = open_queue(tmp_path)
    assert (reopened.min_offset, reopened.max_offset) == (7, 13)
    assert [u.phys_offset for u in reopened.get(7, 10).units] == [unit(n)[0] for n in range(100, 106)]
    moved = reopened.get(2, 10)
    assert moved.status is GetStatus.OFFSET_TOO_SMALL and moved.next_offset == 7
    with pytest.raises(ConsumeQueueError):
        reopened.put(5, *unit(99))
