"""DLedgerFileStore: segment layout, recovery, replication checks, retention, flushing."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.entry import BLANK, HEADER_SIZE, INDEX_RECORD, MAGIC_BLANK, encode_entry
from dledger.errors import CorruptLogError, DLedgerError, ResponseCode
from dledger.store.file_store import DLedgerFileStore
from dledger.store.properties import read_properties

DATA_FILE_SIZE = 4096
INDEX_FILE_SIZE = 32 * 64


def make_config(data_dir: Path, self_id: str = "n0", **overrides: object) -> DLedgerConfig:
    settings: dict[str, object] = dict(data_file_size=DATA_FILE_SIZE, index_file_size=INDEX_FILE_SIZE,
                                       max_entry_size=1500)
    settings.update(overrides)
    return DLedgerConfig(self_id=self_id, peers=(PeerAddress(self_id, "127.0.0.1", 1),),
                         data_dir=str(data_dir), **settings)  # type: ignore[arg-type]


def open_store(data_dir: Path, self_id: str = "n0", **overrides: object) -> DLedgerFileStore:
    store = DLedgerFileStore(make_config(data_dir, self_id, **overrides))
    store.open()
    return store


def make_bodies(count: int, seed: int = 1, low: int = 20, high: int = 900) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(low, high)) for _ in range(count)]


def crash_image(store: DLedgerFileStore, destination: Path) -> Path:
    """What a crash right now would leave behind: the files as written so far,
    without the checkpoint a clean close would write."""
    shutil.copytree(store.base_dir, destination / os.path.basename(store.base_dir))
    return destination


def files_of(store: DLedgerFileStore, kind: str) -> dict[str, bytes]:
    directory = os.path.join(store.base_dir, kind)
    return {name: Path(directory, name).read_bytes() for name in sorted(os.listdir(directory))}


def data_path(store: DLedgerFileStore, pos: int) -> Path:
    start = pos - pos % DATA_FILE_SIZE
    return Path(store.base_dir, "data", f"{start:020d}")


def patch_bytes(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_body_byte(store: DLedgerFileStore, pos: int, image: Path | None = None, bit: int = 0x40) -> None:
    """Flip a body bit of the entry at `pos`: in the store's own files, or in
    a crash image of them (see crash_image)."""
    path = data_path(store, pos)
    if image is not None:
        path = Path(image, os.path.basename(store.base_dir), "data", path.name)
    at = pos % DATA_FILE_SIZE + HEADER_SIZE + 3
    original = path.read_bytes()[at]
    patch_bytes(path, at, bytes([original ^ bit]))


def tree_digest(store: DLedgerFileStore) -> str:
    digest = hashlib.sha256()
    for kind in ("data", "index"):
        for name, content in files_of(store, kind).items():
            digest.update(name.encode() + content)
    return digest.hexdigest()


def error_code(excinfo: pytest.ExceptionInfo[DLedgerError]) -> ResponseCode:
    return excinfo.value.code


# ---------------------------------------------------------------------- layout


def test_entries_roll_into_the_next_segment_behind_a_blank(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(40)
    placed = store.append_as_leader(bodies[:25], term=1) + store.append_as_leader(bodies[25:], term=2)

    names = sorted(os.listdir(os.path.join(store.base_dir, "data")))
    assert len(names) >= 4
    assert names == [f"{k * DATA_FILE_SIZE:020d}" for k in range(len(names))]
    assert all(os.path.getsize(os.path.join(store.base_dir, "data", n)) == DATA_FILE_SIZE for n in names)

    rolls = 0
    for (index, pos), (_, next_pos) in zip(placed, placed[1:]):
        end = pos + HEADER_SIZE + len(bodies[index])
        if next_pos == end:
            continue
        # A roll: the rest of the segment is one BLANK record, the entry starts the next one.
        rolls += 1
        assert next_pos % DATA_FILE_SIZE == 0 and next_pos - end < HEADER_SIZE + len(bodies[index + 1]) + 8
        content = data_path(store, end).read_bytes()
        assert BLANK.unpack_from(content, end % DATA_FILE_SIZE) == (MAGIC_BLANK, next_pos - end)
        assert content[end % DATA_FILE_SIZE + 8:] == bytes(next_pos - end - 8)
    assert rolls == len(names) - 1

    entries = store.read_entries(0, 39, 1 << 20)
    assert [e.body for e in entries] == bodies
    assert [(e.index, e.pos) for e in entries] == placed
    assert [e.term for e in entries] == [1] * 25 + [2] * 15
    assert store.get(17).body == bodies[17]
    store.close()


def test_read_raw_stays_inside_one_segment_and_respects_limits(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(40)
    placed = store.append_as_leader(bodies, term=1)
    index = 0
    while index < 40:
        data, count = store.read_raw(index, 1200, 5)
        assert 1 <= count <= 5
        assert count == 1 or len(data) <= 1200
        first_pos = placed[index][1]
        assert first_pos // DATA_FILE_SIZE == (first_pos + len(data) - 1) // DATA_FILE_SIZE
        assert len(data) == sum(HEADER_SIZE + len(b) for b in bodies[index:index + count])
        index += count
    assert store.read_raw(40, 1200, 5) == (b"", 0)
    store.close()


def test_oversized_entry_and_lower_term_are_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader([b"x"], term=3)
    with pytest.raises(DLedgerError) as too_large:
        store.append_as_leader([b"y" * 1501], term=3)
    assert error_code(too_large) == ResponseCode.ENTRY_TOO_LARGE
    with pytest.raises(DLedgerError) as old_term:
        store.append_as_leader([b"z"], term=2)
    assert error_code(old_term) == ResponseCode.UNEXPECTED_ARGUMENT
    assert store.ledger_end_index == 0
    with pytest.raises(DLedgerError) as beyond:
        store.get(1)
    assert error_code(beyond) == ResponseCode.INDEX_OUT_OF_RANGE
    store.close()


# ---------------------------------------------------------------------- recovery


def test_restart_recovers_end_term_chain_and_bodies(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(30)
    store.append_as_leader(bodies[:10], term=1)
    store.append_as_leader(bodies[10:], term=4)
    asyncio.run(store.flush())
    store.set_committed_index(25)
    state = (store.ledger_end_index, store.ledger_end_term, store.ledger_end_chain_crc, store.write_position)
    store.close()

    checkpoint = read_properties(store.checkpoint_path)
    assert checkpoint["endIndex"] == "29" and checkpoint["committedIndex"] == "25"

    reopened = open_store(tmp_path)
    assert (reopened.ledger_end_index, reopened.ledger_end_term, reopened.ledger_end_chain_crc,
            reopened.write_position) == state
    assert reopened.committed_index == 25 and reopened.flushed_index == 29
    assert [reopened.get(i).body for i in range(30)] == bodies
    assert reopened.append_as_leader([b"more"], term=4)[0][0] == 30
    reopened.close()


def test_checkpoint_never_claims_unflushed_entries_as_committed(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(5), term=1)
    asyncio.run(store.flush())
    store.append_as_leader(make_bodies(5, seed=2), term=1)
    store.set_committed_index(9)  # ASYNC mode may commit before the flush
    store.write_checkpoint()
    checkpoint = read_properties(store.checkpoint_path)
    assert checkpoint["committedIndex"] == "4" and checkpoint["endIndex"] == "4"
    store.close()


def test_torn_last_entry_is_cut_and_appends_continue(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    bodies = make_bodies(12)
    store.append_as_leader(bodies[:6], term=1)
    asyncio.run(store.flush())
    store.set_committed_index(5)
    store.write_checkpoint()
    placed = store.append_as_leader(bodies[6:], term=2)  # in the page cache only
    crashed = crash_image(store, tmp_path / "crash")
    store.close()

    # The last write was torn: its body's end never reached the disk.
    torn_index, torn_pos = placed[-1]
    tail = torn_pos % DATA_FILE_SIZE + HEADER_SIZE + len(bodies[11]) - 10
    patch_bytes(Path(crashed, "dledger-n0", "data", data_path(store, torn_pos).name), tail, bytes(10))

    recovered = open_store(crashed)
    assert recovered.ledger_end_index == torn_index - 1
    assert recovered.ledger_end_term == 2
    assert recovered.write_position == torn_pos
    assert recovered.get(10).body == bodies[10]
    with pytest.raises(DLedgerError):
        recovered.get(11)
    again = recovered.append_as_leader([bodies[11]], term=2)
    assert again == [(torn_index, torn_pos)]
    assert recovered.get(11).body == bodies[11]
    recovered.close()


def test_torn_tail_cut_when_the_file_was_never_fully_written(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    store.append_as_leader(make_bodies(20), term=1)
    crashed = crash_image(store, tmp_path / "crash")
    last_pos = store.position_of(19)
    store.close()
    # No checkpoint, and the last entry's whole body is zeros (a sparse, unwritten range).
    path = Path(crashed, "dledger-n0", "data", data_path(store, last_pos).name)
    patch_bytes(path, last_pos % DATA_FILE_SIZE + HEADER_SIZE, bytes(50))
    recovered = open_store(crashed)
    assert recovered.ledger_end_index == 18
    assert recovered.committed_index == -1
    recovered.close()


def test_flipped_byte_in_the_committed_region_refuses_to_open(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(20), term=1)
    asyncio.run(store.flush())
    store.set_committed_index(19)
    pos = store.position_of(19)
    store.close()
    flip_body_byte(store, pos)  # the entry recovery starts from

    with pytest.raises(CorruptLogError, match="entry 19 .*refusing to cut it"):
        open_store(tmp_path, repair_damaged_log=False)


def test_a_damaged_committed_entry_is_cut_for_repair_when_allowed(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    store.append_as_leader(make_bodies(20), term=1)
    asyncio.run(store.flush())
    store.set_committed_index(15)
    store.write_checkpoint()       # recovery would start after entry 19: damage that very entry
    store.append_as_leader(make_bodies(5, seed=9), term=1)
    asyncio.run(store.flush())     # flushed (perhaps acknowledged), no checkpoint yet
    pos = store.position_of(19)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    flip_body_byte(store, pos, image=crashed, bit=0x40)
    reopened = open_store(crashed)
    assert reopened.damaged_from == 19 and reopened.ledger_end_index == 18
    assert reopened.acknowledged_end == 24     # every entry it had appended, damaged or not
    reopened.close()
    again = open_store(crashed)                # the cut is durable: a clean open now
    assert again.ledger_end_index == 18 and again.damaged_from == -1
    again.close()


def test_the_scrubber_check_finds_a_flipped_byte_and_the_cut_drops_it(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(30), term=1)
    asyncio.run(store.flush())
    store.set_committed_index(29)
    store.write_checkpoint()
    flip_body_byte(store, store.position_of(12))
    index, damaged = 0, -1
    while damaged < 0 and index <= store.ledger_end_index:
        index, damaged = store.find_damage(index, 2000)
    assert damaged == 12
    store.cut_damaged(12)
    assert store.ledger_end_index == 11 and store.committed_index == 11
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.ledger_end_index == 11
    reopened.close()


def test_flipped_byte_behind_the_checkpoint_is_caught_by_reads(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(20)
    store.append_as_leader(bodies, term=1)
    asyncio.run(store.flush())
    store.set_committed_index(19)
    pos = store.position_of(7)
    store.close()
    flip_body_byte(store, pos)

    # Recovery reads only after the checkpoint, so it opens; every read checks the CRC.
    reopened = open_store(tmp_path)
    assert reopened.get(6).body == bodies[6]
    with pytest.raises(CorruptLogError, match="entry 7"):
        reopened.get(7)
    with pytest.raises(CorruptLogError):
        reopened.read_entries(5, 10, 1 << 20)
    reopened.close()


def test_flipped_byte_in_the_unflushed_tail_is_cut_as_torn(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    bodies = make_bodies(20)
    store.append_as_leader(bodies[:10], term=1)
    asyncio.run(store.flush())
    store.set_committed_index(9)
    store.write_checkpoint()
    store.append_as_leader(bodies[10:], term=1)
    crashed = crash_image(store, tmp_path / "crash")
    pos = store.position_of(14)
    store.close()
    path = Path(crashed, "dledger-n0", "data", data_path(store, pos).name)
    at = pos % DATA_FILE_SIZE + HEADER_SIZE + 1
    patch_bytes(path, at, bytes([path.read_bytes()[at] ^ 1]))

    recovered = open_store(crashed)
    assert recovered.ledger_end_index == 13
    assert recovered.committed_index == 9
    assert [e.body for e in recovered.read_entries(0, 13, 1 << 20)] == bodies[:14]
    recovered.close()


def test_recovery_rewrites_missing_index_records(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    bodies = make_bodies(30)
    store.append_as_leader(bodies[:10], term=1)
    asyncio.run(store.flush())
    store.write_checkpoint()
    store.append_as_leader(bodies[10:], term=1)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    # The index pages of entries 10.. never made it to disk.
    index_file = Path(crashed, "dledger-n0", "index", f"{0:020d}")
    patch_bytes(index_file, 10 * 32, bytes(20 * 32))

    recovered = open_store(crashed)
    assert recovered.ledger_end_index == 29
    assert [recovered.get(i).body for i in range(30)] == bodies
    assert INDEX_RECORD.unpack_from(index_file.read_bytes(), 20 * 32)[3] == 20
    recovered.close()


def test_missing_or_short_segment_refuses_to_open(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(40), term=1)
    store.close()
    data_dir = Path(store.base_dir, "data")
    middle = sorted(data_dir.iterdir())[1]
    content = middle.read_bytes()
    middle.unlink()
    with pytest.raises(CorruptLogError, match="contiguous"):
        open_store(tmp_path)
    middle.write_bytes(content[:100])
    with pytest.raises(CorruptLogError, match="expected exactly 4096"):
        open_store(tmp_path)


def test_a_crash_inside_segment_creation_leaves_a_log_that_opens(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(40), term=1)
    asyncio.run(store.flush())
    store.write_checkpoint()
    end = store.ledger_end_index
    store.close()
    data_dir = Path(store.base_dir, "data")
    last = sorted(data_dir.iterdir())[-1]
    next_start = int(last.name) + DATA_FILE_SIZE
    # Today's creation: a temporary file the crash left behind.
    Path(data_dir, f"{next_start:020d}.creating").write_bytes(bytes(10))
    # An older version's creation cut short: the last segment exists, short.
    Path(data_dir, f"{next_start:020d}").write_bytes(b"")
    reopened = open_store(tmp_path)
    assert reopened.ledger_end_index == end
    assert not [p for p in data_dir.iterdir() if p.name.endswith(".creating")]
    more = reopened.append_as_leader(make_bodies(10, seed=3), term=1)
    assert more[-1][0] == end + 10 and reopened.get(end + 10).index == end + 10
    reopened.close()


# ---------------------------------------------------------------------- truncate


def test_truncate_moves_the_end_and_refuses_committed_entries(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(30)
    placed = store.append_as_leader(bodies, term=1)
    chain_at_20 = store.chain_crc_at(20)
    asyncio.run(store.flush())
    store.set_committed_index(12)
    store.write_checkpoint()

    with pytest.raises(DLedgerError) as refused:
        store.truncate(11)
    assert error_code(refused) == ResponseCode.INCONSISTENT_STATE
    assert store.ledger_end_index == 29

    store.truncate(20)
    assert store.ledger_end_index == 20
    assert store.ledger_end_chain_crc == chain_at_20
    assert store.write_position == placed[20][1] + HEADER_SIZE + len(bodies[20])
    assert store.flushed_index == 20
    with pytest.raises(DLedgerError):
        store.get(21)

    # Same entries again: same positions, same chain.
    assert store.append_as_leader(bodies[21:], term=1) == placed[21:]
    chain_at_29 = store.ledger_end_chain_crc
    store.truncate(15)
    store.close()

    reopened = open_store(tmp_path)
    assert reopened.ledger_end_index == 15
    assert reopened.append_as_leader(bodies[16:], term=1) == placed[16:]
    assert reopened.ledger_end_chain_crc == chain_at_29
    reopened.close()


def test_truncated_entries_do_not_come_back_after_a_crash(tmp_path: Path) -> None:
    # Big enough that the dropped suffix reaches past the zeroed zone after the cut.
    sizes = dict(data_file_size=1 << 20, index_file_size=32 * 4096)
    store = open_store(tmp_path / "live", **sizes)
    store.append_as_leader([b"%06d" % i * 20 for i in range(3000)], term=1)
    asyncio.run(store.flush())
    store.set_committed_index(3)
    store.write_checkpoint()  # recovery would start at entry 2999
    store.truncate(4)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    recovered = open_store(crashed, **sizes)
    assert recovered.ledger_end_index == 4
    recovered.close()


# ---------------------------------------------------------------------- follower


def replicate(leader: DLedgerFileStore, follower: DLedgerFileStore, max_bytes: int, max_count: int) -> int:
    pushes = 0
    while follower.ledger_end_index < leader.ledger_end_index:
        start = follower.ledger_end_index + 1
        data, count = leader.read_raw(start, max_bytes, max_count)
        assert follower.append_as_follower(data, start, count) == start + count - 1
        pushes += 1
    return pushes


def test_follower_files_are_byte_identical_to_the_leader(tmp_path: Path) -> None:
    leader = open_store(tmp_path, "a")
    follower = open_store(tmp_path, "b")
    bodies = make_bodies(120, seed=5)
    for term, batch in ((1, bodies[:50]), (2, bodies[50:51]), (3, bodies[51:])):
        leader.append_as_leader(batch, term=term)
    pushes = replicate(leader, follower, max_bytes=2500, max_count=9)
    assert pushes > 10
    assert len(files_of(leader, "data")) >= 10
    assert files_of(follower, "data") == files_of(leader, "data")
    assert files_of(follower, "index") == files_of(leader, "index")
    assert (follower.ledger_end_index, follower.ledger_end_term, follower.ledger_end_chain_crc) == \
        (leader.ledger_end_index, leader.ledger_end_term, leader.ledger_end_chain_crc)
    leader.close()
    follower.close()


def test_follower_refuses_bad_pushes_and_writes_nothing(tmp_path: Path) -> None:
    leader = open_store(tmp_path, "a")
    follower = open_store(tmp_path, "b")
    bodies = make_bodies(20, seed=6)
    leader.append_as_leader(bodies, term=1)
    data, count = leader.read_raw(0, 2000, 3)
    follower.append_as_follower(data, 0, count)
    before = (tree_digest(follower), follower.ledger_end_index, follower.write_position)

    data, count = leader.read_raw(count, 2000, 3)
    first = follower.ledger_end_index + 1
    bad_pushes = {
        "index": (data, first + 1, count),
        "count": (data, first, count + 1),
        "crc": (data[:HEADER_SIZE + 5] + bytes([data[HEADER_SIZE + 5] ^ 1]) + data[HEADER_SIZE + 6:], first, count),
    }
    # An entry whose CRCs are right but whose pos is not where this store puts it.
    wrong_pos, _ = encode_entry(first, 1, follower.write_position + 8, bodies[first],
                                follower.ledger_end_chain_crc)
    bad_pushes["pos"] = (wrong_pos, first, 1)
    # An entry that is fine by itself but does not follow this store's last entry.
    unlinked, _ = encode_entry(first, 1, follower.write_position, bodies[first], 12345)
    bad_pushes["chain"] = (unlinked, first, 1)
    for name, (push, first_index, push_count) in bad_pushes.items():
        with pytest.raises(DLedgerError) as refused:
            follower.append_as_follower(push, first_index, push_count)
        assert error_code(refused) == ResponseCode.INCONSISTENT_STATE, name
        assert (tree_digest(follower), follower.ledger_end_index, follower.write_position) == before, name

    replicate(leader, follower, 2000, 3)
    assert files_of(follower, "data") == files_of(leader, "data")
    leader.close()
    follower.close()


def test_reset_then_follow_from_the_leaders_begin(tmp_path: Path) -> None:
    leader = open_store(tmp_path, "a")
    follower = open_store(tmp_path, "b")
    bodies = make_bodies(80, seed=7)
    leader.append_as_leader(bodies[:40], term=1)
    leader.append_as_leader(bodies[40:], term=2)
    follower.append_as_leader([b"stale"], term=1)  # divergent, uncommitted

    begin = 37
    follower.reset(begin, leader.position_of(begin), leader.term_at(begin - 1), leader.chain_crc_at(begin - 1))
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (begin, begin - 1)
    assert follower.write_position == leader.position_of(begin)
    assert follower.term_at(begin - 1) == 1
    replicate(leader, follower, 3000, 10)

    assert follower.ledger_end_chain_crc == leader.ledger_end_chain_crc
    assert [e.body for e in follower.read_entries(begin, 79, 1 << 20)] == bodies[begin:]
    with pytest.raises(DLedgerError) as below:
        follower.get(begin - 1)
    assert error_code(below) == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
    # The segment holding the begin starts with a BLANK up to it; later ones match the leader's.
    begin_pos = leader.position_of(begin)
    first_name = f"{begin_pos - begin_pos % DATA_FILE_SIZE:020d}"
    follower_data, leader_data = files_of(follower, "data"), files_of(leader, "data")
    assert BLANK.unpack_from(follower_data[first_name]) == (MAGIC_BLANK, begin_pos % DATA_FILE_SIZE)
    assert {n: c for n, c in follower_data.items() if n != first_name} == \
        {n: c for n, c in leader_data.items() if n > first_name}
    follower.close()

    reopened = open_store(tmp_path, "b")
    assert (reopened.ledger_begin_index, reopened.ledger_end_index) == (begin, 79)
    assert reopened.chain_crc_at(begin - 1) == leader.chain_crc_at(begin - 1)
    assert reopened.get(begin).body == bodies[begin]
    reopened.close()
    leader.close()


def test_reset_restart_before_any_entry_keeps_the_begin(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.reset(100, 5 * DATA_FILE_SIZE + 200, 7, 0xABCD)
    store.close()
    reopened = open_store(tmp_path)
    assert (reopened.ledger_begin_index, reopened.ledger_end_index, reopened.ledger_end_term) == (100, 99, 7)
    assert reopened.write_position == 5 * DATA_FILE_SIZE + 200
    assert reopened.ledger_end_chain_crc == 0xABCD
    reopened.close()


def test_reset_refuses_to_drop_committed_entries(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(10), term=1)
    store.set_committed_index(8)
    with pytest.raises(DLedgerError) as refused:
        store.reset(5, 1000, 1, 0)
    assert error_code(refused) == ResponseCode.INCONSISTENT_STATE
    assert store.ledger_end_index == 9
    store.close()


# ---------------------------------------------------------------------- retention


def test_retention_deletes_old_segments_below_the_keep_index(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(60, seed=8)
    placed = store.append_as_leader(bodies, term=1)
    store.append_as_leader([b"x"], term=2)
    data_dir = Path(store.base_dir, "data")
    segments = sorted(data_dir.iterdir())
    assert len(segments) >= 5
    first_in = {pos // DATA_FILE_SIZE: index for index, pos in reversed(placed)}

    assert store.delete_expired(keep_from_index=60, older_than_wall_s=time.time() - 3600) == 0  # too new
    old = time.time() - 7200
    for path in segments:
        os.utime(path, (old, old))
    keep_from = first_in[3] + 1  # segment 2 still holds entries below it; segment 3 does not
    deleted = store.delete_expired(keep_from_index=keep_from, older_than_wall_s=time.time() - 3600)
    assert deleted == 3
    assert sorted(p.name for p in data_dir.iterdir())[0] == f"{3 * DATA_FILE_SIZE:020d}"
    begin = first_in[3]
    assert store.ledger_begin_index == begin
    assert store.term_at(begin - 1) == 1
    with pytest.raises(DLedgerError) as below:
        store.get(begin - 1)
    assert error_code(below) == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
    chain_before_begin = store.chain_crc_at(begin - 1)
    store.close()

    reopened = open_store(tmp_path)
    assert (reopened.ledger_begin_index, reopened.ledger_end_index) == (begin, 60)
    assert reopened.chain_crc_at(begin - 1) == chain_before_begin
    assert [e.body for e in reopened.read_entries(begin, 59, 1 << 20)] == bodies[begin:]
    reopened.close()


def test_retention_never_deletes_the_current_segment(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(60, seed=9), term=1)
    old = time.time() - 7200
    for path in Path(store.base_dir, "data").iterdir():
        os.utime(path, (old, old))
    store.delete_expired(keep_from_index=10**9, older_than_wall_s=time.time())
    assert len(os.listdir(Path(store.base_dir, "data"))) == 1
    assert store.get(store.ledger_end_index).index == 59
    store.close()


# ---------------------------------------------------------------------- terms


def test_first_index_of_term_finds_each_terms_first_entry(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for term, count in ((1, 3), (2, 2), (5, 4), (6, 1)):
        store.append_as_leader([b"e"] * count, term=term)
    # indexes: term 1 -> 0..2, term 2 -> 3..4, term 5 -> 5..8, term 6 -> 9
    assert store.first_index_of_term(1, 9) == 0
    assert store.first_index_of_term(2, 9) == 3
    assert store.first_index_of_term(5, 9) == 5
    assert store.first_index_of_term(5, 6) == 5
    assert store.first_index_of_term(6, 9) == 9
    assert store.first_index_of_term(5, 4) == -1
    assert store.first_index_of_term(3, 9) == -1
    assert store.first_index_of_term(7, 9) == -1
    store.close()


# ---------------------------------------------------------------------- flushing


async def test_concurrent_flushes_share_one_fsync_round(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(10), term=1)
    results = await asyncio.gather(*(store.flush() for _ in range(50)))
    assert results == [9] * 50
    # The first caller's round, then at most one round for all who came meanwhile.
    assert 1 <= store.fsync_count <= 2
    assert store.flushed_index == 9

    rounds_before = store.fsync_count

    async def append_and_flush(n: int) -> int:
        store.append_as_leader([b"b%d" % n], term=1)
        return await store.flush()

    results = await asyncio.gather(*(append_and_flush(n) for n in range(40)))
    assert store.flushed_index == 49 and max(results) == 49
    assert store.fsync_count - rounds_before <= 3
    store.close()


async def test_flush_runs_fsync_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path)
    store.append_as_leader([b"x"], term=1)
    loop_thread = __import__("threading").get_ident()
    fsync_threads: list[int] = []
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        fsync_threads.append(__import__("threading").get_ident())
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    assert await store.flush() == 0
    assert fsync_threads and loop_thread not in fsync_threads
    monkeypatch.undo()
    store.close()


# ---------------------------------------------------------------------- disk full


def test_read_only_store_refuses_appends_with_disk_full(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader([b"a"], term=1)
    store.read_only_reason = "disk 95% full"
    for append in (lambda: store.append_as_leader([b"b"], term=1),
                   lambda: store.append_as_follower(b"x" * 60, 1, 1)):
        with pytest.raises(DLedgerError) as full:
            append()
        assert error_code(full) == ResponseCode.DISK_FULL
    store.check_disk()  # this disk is not 90% full
    assert store.read_only_reason == ""
    store.append_as_leader([b"b"], term=1)
    store.close()


def test_enospc_mid_append_leaves_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path)
    bodies = make_bodies(30, seed=11)
    store.append_as_leader(bodies[:5], term=1)
    before = (tree_digest(store), store.ledger_end_index, store.write_position, store.ledger_end_chain_crc)
    real_pwrite = os.pwrite
    calls = {"n": 0}

    def pwrite_fails_once(fd: int, data: bytes, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:  # the first segment's bytes land, then the disk fills
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite_fails_once)
    with pytest.raises(DLedgerError) as full:
        store.append_as_leader(bodies[5:], term=1)  # spans several segments
    assert error_code(full) == ResponseCode.DISK_FULL
    assert calls["n"] >= 2
    monkeypatch.undo()
    assert (tree_digest(store), store.ledger_end_index, store.write_position,
            store.ledger_end_chain_crc) == before
    # Read-only now, until the disk check (the retention loop) sees room.
    with pytest.raises(DLedgerError) as still_full:
        store.append_as_leader(bodies[5:], term=1)
    assert error_code(still_full) == ResponseCode.DISK_FULL
    store.check_disk()

    placed = store.append_as_leader(bodies[5:], term=1)
    assert placed[0] == (5, before[2])
    store.close()
    reopened = open_store(tmp_path)
    assert [e.body for e in reopened.read_entries(0, 29, 1 << 20)] == bodies
    reopened.close()



def test_append_hook_sees_final_positions_and_may_patch_bodies_in_place(tmp_path):
    store = open_store(tmp_path)
    bodies = [bytearray(b"pos=?" + bytes(8)) for _ in range(12)] + [bytearray(1200)]
    seen: list[int] = []

    def stamp(positions: list[int]) -> None:
        seen.extend(positions)
        for body, pos in zip(bodies, positions):
            body[5:13] = (pos + HEADER_SIZE).to_bytes(8, "big")

    placed = store.append_as_leader(bodies, term=1, prepare=stamp)
    assert seen == [pos for _, pos in placed]
    for index, pos in placed:
        entry = store.get(index)                       # CRCs cover the patched bytes
        assert int.from_bytes(entry.body[5:13], "big") == pos + HEADER_SIZE
        assert store.get_at_position(pos) == entry


def test_an_append_hook_that_resizes_a_body_writes_nothing(tmp_path):
    store = open_store(tmp_path)
    body = bytearray(b"abc")
    with pytest.raises(DLedgerError):
        store.append_as_leader([body], term=1, prepare=lambda positions: body.extend(b"!"))
    assert store.ledger_end_index == -1 and store.write_position == 0


def test_get_at_position_refuses_positions_that_are_not_entries(tmp_path):
    store = open_store(tmp_path)
    placed = store.append_as_leader(make_bodies(3), term=1)
    for bad in (placed[0][1] + 1, store.write_position, -48, 10 * DATA_FILE_SIZE):
        with pytest.raises(DLedgerError) as e:
            store.get_at_position(bad)
        assert e.value.code is ResponseCode.INDEX_OUT_OF_RANGE


def test_get_at_position_with_any_size_hint_finds_the_same_entry(tmp_path):
    # A ConsumeQueue unit's size saves a read; a stale or wrong one must not change the answer.
    store = open_store(tmp_path)
    placed = store.append_as_leader(make_bodies(3), term=1)
    for index, pos in placed:
        entry = store.get(index)
        for hint in (entry.size, entry.size - 1, entry.size + 1, HEADER_SIZE, 10 * DATA_FILE_SIZE, None):
            assert store.get_at_position(pos, hint) == entry
    with pytest.raises(DLedgerError):
        store.get_at_position(placed[0][1] + 1, placed[0][1])


def test_a_background_checkpoint_older_than_one_written_since_is_not_put_in_place(tmp_path):
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(5), term=1)
    store._sync_everything()
    store.write_checkpoint()                # at entry 4: truncate must rewrite it
    stale = store._checkpoint_now()
    generation = store.checkpoint.generation
    store.truncate(2)                      # writes its own checkpoint now, from the cut log
    written_by_truncate = Path(store.checkpoint_path).read_bytes()
    state = store._index.take_dirty()
    assert store._persist_checkpoint(state, stale, generation) is False
    assert Path(store.checkpoint_path).read_bytes() == written_by_truncate
    assert not [name for name in os.listdir(store.base_dir) if name.endswith(".tmp")]
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.ledger_end_index == 2


def test_a_checkpoint_in_flight_during_a_truncate_never_lands_past_the_cut(tmp_path):
    # Captured before the truncate (at entry 9), written after it: the last
    # finished checkpoint (entry 4) lies before the cut, so only the one in
    # flight would point into the dropped entries.
    store = open_store(tmp_path / "live")
    store.append_as_leader(make_bodies(5), term=1)
    asyncio.run(store.flush())
    store.write_checkpoint()
    store.append_as_leader(make_bodies(5, seed=2), term=1)
    asyncio.run(store.flush())
    stale = store._checkpoint_now()
    generation = store.checkpoint.generation
    state = store._index.take_dirty()
    store.truncate(6)
    store._persist_checkpoint(state, stale, generation)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    recovered = open_store(crashed)
    assert recovered.ledger_end_index == 6
    recovered.close()


def test_a_checkpoint_renamed_just_before_a_truncate_is_rewritten_by_it(tmp_path):
    # The flush thread put the checkpoint (entry 9) in place, but the event
    # loop has not yet heard so when the truncate runs.
    store = open_store(tmp_path / "live")
    store.append_as_leader(make_bodies(10), term=1)
    asyncio.run(store.flush())
    captured = store._checkpoint_now()
    assert store._persist_checkpoint(store._index.take_dirty(), captured, store.checkpoint.generation)
    store.truncate(6)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    recovered = open_store(crashed)
    assert recovered.ledger_end_index == 6
    recovered.close()


async def test_retention_in_the_background_deletes_what_the_sync_path_would(tmp_path):
    store = open_store(tmp_path)
    store.append_as_leader(make_bodies(60), term=1)
    await store.flush()
    store.set_committed_index(store.ledger_end_index)
    before = len(store._data.segments)
    deleted = await store.delete_expired_in_background(keep_from_index=40, older_than_wall_s=time.time() + 60)
    assert deleted > 0 and len(store._data.segments) == before - deleted
    assert len(os.listdir(os.path.join(store.base_dir, "data"))) == len(store._data.segments)
    begin = store.ledger_begin_index
    assert 0 < begin <= 40 and store.get(begin).index == begin
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.ledger_begin_index == begin and reopened.ledger_end_index == 59
    reopened.close()


def test_a_flipped_byte_past_the_checkpoint_with_entries_after_it_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live")
    store.append_as_leader(make_bodies(10), term=1)
    asyncio.run(store.flush())
    store.set_committed_index(9)
    store.write_checkpoint()
    store.append_as_leader(make_bodies(10, seed=4), term=1)   # flushed, maybe acknowledged, not checkpointed
    asyncio.run(store.flush())
    pos = store.position_of(14)
    crashed = crash_image(store, tmp_path / "crash")
    store.close()
    flip_body_byte(store, pos, image=crashed, bit=0x04)
    reopened = open_store(crashed)
    assert reopened.damaged_from == 14 and reopened.acknowledged_end == 19 and reopened.ledger_end_index == 13
    reopened.close()
