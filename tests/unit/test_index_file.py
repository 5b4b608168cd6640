"""IndexFile and IndexService: the on-disk hash index from keys to commit log offsets."""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from store import message_const as mc
from store.errors import CorruptFileError
from store.index_file import INDEX_HEADER_SIZE, IndexFile, index_file_size
from store.index_service import IndexService, build_key, file_name_of, time_of_file_name
from store.java_hash import index_key_hash

SLOTS = 4
ITEMS = 6  # item 0 is unused: 5 keys per file
T0 = 1_700_000_000_000  # ms


def fixed_clock(ms: int = T0) -> Callable[[], float]:
    return lambda: ms / 1000


def open_service(tmp_path: Path, **kwargs: object) -> IndexService:
    return IndexService.open(str(tmp_path), hash_slot_num=SLOTS, index_num=ITEMS,
                             clock=fixed_clock(), **kwargs)  # type: ignore[arg-type]


def query(service: IndexService, key: str, **kwargs: object) -> list[int]:
    options: dict[str, object] = dict(max_num=100, begin_ms=0, end_ms=T0 * 2)
    options.update(kwargs)
    return service.query("TopicTest", key, **options)  # type: ignore[arg-type]


def keys_sharing_a_slot() -> tuple[str, str]:
    """Two keys whose hashes differ but land in the same slot."""
    seen: dict[int, tuple[str, int]] = {}
    for n in range(100):
        key = f"key-{n}"
        key_hash = index_key_hash(build_key("TopicTest", key))
        slot = key_hash % SLOTS
        if slot in seen and seen[slot][1] != key_hash:
            return seen[slot][0], key
        seen.setdefault(slot, (key, key_hash))
    raise AssertionError("no two keys share a slot")


# --- layout ------------------------------------------------------------------------


def test_file_layout_is_header_slots_then_items(tmp_path: Path):
    service = open_service(tmp_path)
    service.put(build_key("TopicTest", "a"), 4096, T0)
    service.put(build_key("TopicTest", "a"), 8192, T0 + 2500)
    [index_file] = service.files
    raw = Path(index_file.path).read_bytes()
    assert len(raw) == index_file_size(SLOTS, ITEMS) == 40 + SLOTS * 4 + ITEMS * 20
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0, T0 + 2500, 4096, 8192, 1, 3)
    key_hash = index_key_hash("TopicTest#a")
    slot = struct.unpack_from(">i", raw, INDEX_HEADER_SIZE + (key_hash % SLOTS) * 4)[0]
    assert slot == 2  # the newest item
    items = INDEX_HEADER_SIZE + SLOTS * 4
    assert raw[items:items + 20] == bytes(20)  # item 0 is never used
    assert struct.unpack_from(">iqii", raw, items + 20) == (key_hash, 4096, 0, 0)
    assert struct.unpack_from(">iqii", raw, items + 40) == (key_hash, 8192, 2, 1)  # 2 s later, previous = item 1


def test_file_names_are_utc_creation_times_to_the_millisecond():
    assert file_name_of(1609459200123) == "20210101000000123"
    assert time_of_file_name("20210101000000123") == 1609459200123
    assert time_of_file_name("not-an-index-file") is None


# --- put and query -----------------------------------------------------------------


def test_query_returns_offsets_newest_first(tmp_path: Path):
    service = open_service(tmp_path)
    for n, key in enumerate(["a", "b", "a", "a"]):
        service.put(build_key("TopicTest", key), 1000 * (n + 1), T0 + n)
    assert query(service, "a") == [4000, 3000, 1000]
    assert query(service, "b") == [2000]
    assert query(service, "a", max_num=2) == [4000, 3000]
    assert query(service, "missing") == []
    assert service.query("OtherTopic", "a", 10, 0, T0 * 2) == []


def test_keys_sharing_a_slot_are_told_apart_by_their_hash(tmp_path: Path):
    first, second = keys_sharing_a_slot()
    service = open_service(tmp_path)
    service.put(build_key("TopicTest", first), 100, T0)
    service.put(build_key("TopicTest", second), 200, T0)
    service.put(build_key("TopicTest", first), 300, T0)
    assert query(service, first) == [300, 100]
    assert query(service, second) == [200]


def test_keys_with_equal_hashes_are_both_returned_for_the_caller_to_check(tmp_path: Path):
    # "Aa" and "BB" have the same Java hash code, so topic#Aa and topic#BB do too.
    service = open_service(tmp_path)
    service.put(build_key("TopicTest", "Aa"), 100, T0)
    service.put(build_key("TopicTest", "BB"), 200, T0)
    assert query(service, "Aa") == query(service, "BB") == [200, 100]


def test_query_honours_the_time_range(tmp_path: Path):
    service = open_service(tmp_path)
    for n in range(5):  # one message a minute
        service.put(build_key("TopicTest", "k"), 100 * (n + 1), T0 + n * 60_000)
    assert query(service, "k", begin_ms=T0 + 60_000, end_ms=T0 + 180_000) == [400, 300, 200]
    assert query(service, "k", begin_ms=T0 + 61_000, end_ms=T0 + 179_999) == [300]
    # Items keep whole seconds after the file's begin, so a range starting inside
    # an item's second still finds it (a false positive the caller filters, never a miss).
    assert query(service, "k", begin_ms=T0 + 60_500, end_ms=T0 + 179_999) == [300, 200]
    assert query(service, "k", begin_ms=T0 + 300_000, end_ms=T0 + 400_000) == []
    assert query(service, "k", begin_ms=0, end_ms=T0 - 1) == []


def test_query_ignores_items_at_or_past_max_phys_offset(tmp_path: Path):
    service = open_service(tmp_path)
    for n in range(4):
        service.put(build_key("TopicTest", "k"), 100 * (n + 1), T0 + n)
    assert query(service, "k", max_phys_offset=300) == [200, 100]
    assert query(service, "k", max_phys_offset=301) == [300, 200, 100]


def test_put_refuses_bad_arguments_and_writes_nothing(tmp_path: Path):
    service = open_service(tmp_path)
    for key, phys, timestamp, reason in [("", 1, 0, "non-empty"), ("k", 0, 0, "positive"), ("k", 1, -1, "non-negative")]:
        with pytest.raises(ValueError, match=reason):
            service.put(key, phys, timestamp)
    assert service.files == [] and not os.path.exists(tmp_path / "index")


def test_put_message_indexes_the_unique_key_and_each_key(tmp_path: Path):
    service = open_service(tmp_path)
    assert service.put_message("TopicTest", "order-1  order-2", "01ABC", 500, T0) == 3
    assert query(service, "order-1") == query(service, "order-2") == query(service, "01ABC") == [500]
    # A replay of a message already indexed adds nothing.
    assert service.put_message("TopicTest", "order-1", "01ABC", 500, T0) == 0
    assert service.put_message("TopicTest", "order-3", None, 400, T0) == 0
    # A rolled-back transaction's message is not indexed.
    assert service.put_message("TopicTest", "order-9", None, 600, T0, mc.TRANSACTION_ROLLBACK_TYPE) == 0
    assert query(service, "order-1") == [500] and query(service, "order-9") == []


# --- files: rolling, restart, expiry, recovery ---------------------------------------


def fill(service: IndexService, count: int, start_ms: int = T0) -> None:
    for n in range(count):
        service.put(build_key("TopicTest", "k"), 100 * (n + 1), start_ms + n * 1000)


def test_a_full_file_rolls_to_a_new_one_that_continues_it(tmp_path: Path):
    service = open_service(tmp_path)  # the fixed clock: every file is created in the same ms
    fill(service, 12)
    names = [f.name for f in service.files]
    assert len(names) == 3 and names == sorted(names) and len(set(names)) == 3
    assert [f.header.index_count - 1 for f in service.files] == [5, 5, 2]
    assert service.files[1].header.begin_phys_offset == 600  # its first item, not the inherited end
    assert query(service, "k") == [100 * n for n in range(12, 0, -1)]
    assert query(service, "k", begin_ms=T0 + 6000, end_ms=T0 + 7000) == [800, 700]


def test_a_batch_of_messages_spills_over_full_files_and_reads_back_like_single_puts(tmp_path: Path):
    # The apply loop hands a whole run of messages to put_messages: items past
    # a full file go on in the next one, the header is written once per file,
    # and replays and rolled-back transactions are skipped as by put_message.
    batch = [("TopicTest", f"order-{n} shared", f"01ID{n}", 100 * (n + 1), T0 + n * 1000, 0) for n in range(6)]
    batch.insert(3, ("TopicTest", "rolled-back", None, 350, T0, mc.TRANSACTION_ROLLBACK_TYPE))
    batched = open_service(tmp_path / "batched")
    assert batched.put_messages(batch) == 18
    assert batched.put_messages(batch[:4]) == 0  # a replay
    single = open_service(tmp_path / "single")
    assert sum(single.put_message(*message) for message in batch) == 18
    for service in (batched, single):
        assert [f.header.index_count - 1 for f in service.files] == [5, 5, 5, 3]
        assert query(service, "shared") == [100 * n for n in range(6, 0, -1)]
        assert query(service, "order-4") == query(service, "01ID4") == [500]
        assert query(service, "rolled-back") == []
    for one, other in zip(batched.files, single.files):
        assert one.header == other.header
    reopened = IndexService.open(str(tmp_path / "batched"), hash_slot_num=SLOTS, index_num=ITEMS)
    assert [f.header for f in reopened.files] == [f.header for f in batched.files]
    assert query(reopened, "shared") == [100 * n for n in range(6, 0, -1)]


def test_restart_reloads_every_file(tmp_path: Path):
    service = open_service(tmp_path)
    fill(service, 8)
    service.flush()
    service.close()
    reopened = open_service(tmp_path)
    assert len(reopened.files) == 2 and reopened.end_phys_offset == 800
    assert query(reopened, "k") == [100 * n for n in range(8, 0, -1)]
    fill(reopened, 1, T0 + 60_000)
    assert query(reopened, "k")[:2] == [100, 800]


def test_delete_expired_drops_files_that_end_below_the_log_minimum(tmp_path: Path):
    service = open_service(tmp_path)
    fill(service, 12)  # files hold 100..500, 600..1000, 1100..1200
    assert service.delete_expired(500) == 0
    assert service.delete_expired(501) == 1
    assert query(service, "k")[-1] == 600
    assert service.delete_expired(10_000) == 1  # never the last file
    assert [f.header.end_phys_offset for f in service.files] == [1200]
    assert len(os.listdir(tmp_path / "index")) == 1


def test_recovery_deletes_files_that_begin_past_the_committed_end(tmp_path: Path):
    service = open_service(tmp_path)
    fill(service, 12)
    service.close()
    reopened = open_service(tmp_path, committed_end=700)
    assert [f.header.begin_phys_offset for f in reopened.files] == [100, 600]
    assert len(os.listdir(tmp_path / "index")) == 2
    # The items of the kept file past the committed end stay hidden from queries given the bound.
    assert query(reopened, "k", max_phys_offset=700) == [600, 500, 400, 300, 200, 100]


def test_a_file_of_another_geometry_is_refused(tmp_path: Path):
    service = open_service(tmp_path)
    fill(service, 1)
    service.close()
    with pytest.raises(CorruptFileError, match="expected exactly"):
        IndexService.open(str(tmp_path), hash_slot_num=SLOTS + 1, index_num=ITEMS)


def test_a_damaged_chain_ends_the_walk_instead_of_looping(tmp_path: Path):
    service = open_service(tmp_path)
    fill(service, 3)
    [index_file] = service.files
    service.close()
    items = INDEX_HEADER_SIZE + SLOTS * 4
    with open(index_file.path, "r+b") as f:  # item 1 now claims item 3 comes before it
        f.seek(items + 20 + 16)
        f.write(struct.pack(">i", 3))
    loaded = IndexFile.load(index_file.path, SLOTS, ITEMS)
    found: list[int] = []
    loaded.select_phys_offsets(found, index_key_hash("TopicTest#k"), 100, 0, T0 * 2)
    assert found == [300, 200, 100]


def test_a_crash_before_the_header_is_written_cuts_no_chain(tmp_path: Path, monkeypatch):
    # Items and slots go in before the header: a kill in between left the
    # slot pointing past the header's count, load read it as empty, and the
    # replay started a new chain, losing every older item of the key.
    service = IndexService.open(str(tmp_path), hash_slot_num=SLOTS, index_num=64, clock=fixed_clock())
    service.put("TopicTest#k", 100, T0)
    monkeypatch.setattr(IndexFile, "_write_header", lambda self: None)  # the kill comes before it
    service.put("TopicTest#k", 200, T0 + 1000)
    monkeypatch.undo()
    service.close()
    replayed = IndexService.open(str(tmp_path), hash_slot_num=SLOTS, index_num=64, clock=fixed_clock())
    assert replayed.end_phys_offset == 100
    for phys_offset in (200, 300):  # the apply loop replays from its checkpoint
        replayed.put("TopicTest#k", phys_offset, T0 + phys_offset * 10)
    assert query(replayed, "k") == [300, 200, 100]
