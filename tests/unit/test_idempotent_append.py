"""Idempotent appends: a (producer id, sequence) the group already holds is
answered with its original indexes, by the same leader, by a new leader and
after a restart; the producer table itself; and what readers see of the marks."""
from __future__ import annotations

import asyncio
import json
import struct

import pytest

from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL, MAGIC_PRODUCER_MARK
from dledger.errors import DLedgerError, ResponseCode
from dledger.producer_table import AppendedRange, Mark, ProducerTable, decode_mark, encode_mark
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


def user_bodies(cluster: Cluster, node: str) -> list[bytes]:
    store = cluster.servers[node].store
    return [e.body for e in store.read_entries(store.ledger_begin_index, store.ledger_end_index, 1 << 30)
            if e.magic == MAGIC_NORMAL]


# ------------------------------------------------------------- the table

def test_mark_body_round_trip_in_both_versions():
    assert decode_mark(encode_mark("producer-ü", 7, 3, 1_700_000_000_123)) == Mark("producer-ü", 7, 3, 1_700_000_000_123)
    v1 = struct.pack(">qi", 7, 3) + "producer-ü".encode()   # written by earlier versions
    assert decode_mark(v1) == Mark("producer-ü", 7, 3, 0)


def mark(producer: str, sequence: int, count: int = 1, at_ms: int = 0) -> Mark:
    return Mark(producer, sequence, count, at_ms)


def test_table_answers_known_sequences_and_refuses_forgotten_ones():
    table = ProducerTable(sequences=2)
    for sequence in range(3):
        table.apply_mark(10 * sequence, mark("p", sequence, 2))
    assert table.lookup("p", 2) == AppendedRange(21, 22)
    assert table.lookup("p", 1) == AppendedRange(11, 12)
    assert table.lookup("p", 3) is None          # new
    assert table.lookup("other", 0) is None
    with pytest.raises(DLedgerError) as e:
        table.lookup("p", 0)                      # fell out of the window: outcome unknown
    assert e.value.code is ResponseCode.REPEATED_REQUEST


def test_a_retry_older_than_the_window_is_refused_not_appended_twice():
    table = ProducerTable(window_ms=10_000)
    table.apply_mark(1, mark("p", 0, at_ms=1_000_000))
    assert table.lookup("p", 0, retry_age_ms=60_000) == AppendedRange(2, 2)   # held: answered
    assert table.lookup("p", 1, retry_age_ms=9_000) is None                    # within the window: new
    with pytest.raises(DLedgerError) as e:
        table.lookup("p", 1, retry_age_ms=11_000)
    assert e.value.code is ResponseCode.REPEATED_REQUEST and "duplicate window" in e.value.message


def test_producers_are_forgotten_by_log_time_not_by_count():
    table = ProducerTable(window_ms=10_000)
    table.apply_mark(1, mark("old", 0, at_ms=1_000_000))
    for i in range(100):
        table.apply_mark(3 + 2 * i, mark(f"p{i}", 0, at_ms=1_000_000 + 100 * i))
    assert table.lookup("old", 0) == AppendedRange(2, 2)      # within two windows of the log's time
    table.apply_mark(1000, mark("late", 0, at_ms=1_000_000 + 20_001))
    assert table.lookup("old", 0) is None and len(table) == 100   # "old" went, by age alone


def test_the_count_bound_refuses_retries_from_unknown_producers_while_it_bites():
    table = ProducerTable(max_producers=2, window_ms=10_000)
    table.apply_mark(1, mark("a", 0, at_ms=1_000))
    table.apply_mark(3, mark("b", 0, at_ms=1_001))
    table.apply_mark(5, mark("c", 0, at_ms=1_002))               # "a" dropped early, inside its window
    assert len(table) == 2 and table.lookup("b", 0) is not None
    assert table.lookup("a", 1) is None                           # a first attempt: fine
    with pytest.raises(DLedgerError) as e:
        table.lookup("a", 0, retry_age_ms=5)                      # a retry it cannot judge
    assert e.value.code is ResponseCode.REPEATED_REQUEST


def test_table_snapshot_round_trip_and_incremental_encoding():
    table = ProducerTable(sequences=3)
    for sequence in range(5):
        table.apply_mark(2 * sequence, mark("p", sequence, at_ms=5_000 + sequence))
    table.apply_mark(20, mark("q", 0, at_ms=6_000))
    table.advance(21)
    restored = ProducerTable.from_json(table.to_json(), sequences=3)
    assert restored.applied_index == 21 and restored.log_time_ms == 6_000
    assert restored.lookup("p", 4) == AppendedRange(9, 9)
    with pytest.raises(DLedgerError):
        restored.lookup("p", 1)
    assert table.capture() is None                                # unchanged: nothing to write
    table.apply_mark(30, mark("q", 1, at_ms=6_001))
    table.advance(31)
    encode = table.capture()
    assert encode is not None
    snapshot = encode()
    assert set(snapshot.encoded) == {"q"}                         # only what changed is encoded again
    table.keep(snapshot)
    assert json.loads(snapshot.text) == json.loads(table.to_json())
    again = ProducerTable.from_json(snapshot.text, sequences=3)
    assert again.lookup("q", 1) == AppendedRange(31, 31) and again.lookup("p", 4) == AppendedRange(9, 9)


def test_the_table_is_state_the_garbage_collector_leaves_alone():
    # A full collection runs on the event loop and walks every object it
    # tracks: at the table's limits (10,000 producers x 64 sequences) the
    # appends as objects cost each one 283 ms, long enough for an election.
    import gc
    table = ProducerTable(sequences=4)
    for sequence in range(10):
        for producer in ("p", "q"):
            table.apply_mark(100 * sequence + (producer == "q"), mark(producer, sequence, at_ms=5_000 + sequence))
    restored = ProducerTable.from_json(table.to_json(), sequences=4)
    gc.collect()
    for held in (table, restored):
        appends = held._producers["p"].appends
        assert list(appends) == [6, 7, 8, 9] and not gc.is_tracked(appends)
        assert held.lookup("p", 9) == AppendedRange(901, 901) and held.lookup("q", 6) == AppendedRange(602, 602)


# ------------------------------------------------------------- the cluster

async def test_a_repeated_request_is_answered_with_the_original_indexes(cluster: Cluster):
    leader = cluster.servers[await cluster.wait_leader()]
    first = await leader.append([b"a", b"b"], producer_id="p", sequence=0)
    again = await leader.append([b"a", b"b"], producer_id="p", sequence=0)
    assert again[:2] == first[:2] and again[2] == first[2]
    await leader.append([b"c"], producer_id="p", sequence=1)
    await cluster.wait_converged()
    for node in cluster.servers:
        assert user_bodies(cluster, node) == [b"a", b"b", b"c"]


async def test_the_leader_feeds_its_table_the_marks_it_wrote_without_reading_them_back(cluster: Cluster,
                                                                                       monkeypatch):
    leader = cluster.servers[await cluster.wait_leader()]
    await leader.append([b"first"], producer_id="p", sequence=0)    # past the start of the term
    store, pusher = leader.store, leader.pusher
    scans: list[tuple[int, int]] = []
    real_scan = store.indexes_with_magic
    monkeypatch.setattr(store, "indexes_with_magic", lambda start, end, magic: scans.append((start, end)) or
                        real_scan(start, end, magic))
    first, last, _ = await leader.append([b"a", b"b"], producer_id="p", sequence=1)
    assert pusher.producers.lookup("p", 1) == AppendedRange(first, last) and not scans
    assert not pusher._marks_written                                   # applied, and let go
    # A failed append may have left a mark in the log and not in memory: the
    # log is read again for the rest of the term.
    monkeypatch.setattr(store, "append_as_leader", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        await leader.append([b"c"], producer_id="p", sequence=2)
    monkeypatch.undo()
    monkeypatch.setattr(store, "indexes_with_magic", lambda start, end, magic: scans.append((start, end)) or
                        real_scan(start, end, magic))
    first, last, _ = await leader.append([b"d"], producer_id="p", sequence=3)
    assert pusher.producers.lookup("p", 3) == AppendedRange(first, last) and scans


async def test_concurrent_copies_of_one_request_are_appended_once(cluster: Cluster):
    leader = cluster.servers[await cluster.wait_leader()]
    results = await asyncio.gather(*(leader.append([b"x"], producer_id="p", sequence=0) for _ in range(5)))
    assert len({r[:2] for r in results}) == 1
    assert user_bodies(cluster, leader.config.self_id) == [b"x"]


async def test_a_new_leader_knows_what_the_old_one_appended(cluster: Cluster):
    old = await cluster.wait_leader()
    first, last, _ = await cluster.servers[old].append([b"once"], producer_id="p", sequence=0)
    await cluster.wait_converged()
    term = cluster.servers[old].member_state.term
    await cluster.stop(old)
    new = await cluster.wait_leader(min_term=term + 1)
    retried = await cluster.servers[new].append([b"once"], producer_id="p", sequence=0)
    assert retried[:2] == (first, last)
    assert user_bodies(cluster, new) == [b"once"]


async def test_a_retry_of_an_append_the_old_leader_never_committed_is_appended_once(cluster: Cluster):
    old = await cluster.wait_leader()
    cluster.network.isolate(old)
    stale = asyncio.ensure_future(cluster.servers[old].append([b"lost?"], producer_id="p", sequence=0))
    others = [n for n in cluster.servers if n != old]
    new = await cluster.wait_leader(among=others, min_term=cluster.servers[old].member_state.term + 1)
    retried = await cluster.servers[new].append([b"lost?"], producer_id="p", sequence=0)
    with pytest.raises(DLedgerError):
        await stale
    cluster.network.heal()
    await cluster.wait_converged()
    for node in cluster.servers:
        assert user_bodies(cluster, node) == [b"lost?"]
        assert cluster.servers[node].store.get(retried[0]).body == b"lost?"


async def test_the_table_survives_a_whole_cluster_restart(cluster: Cluster):
    leader = await cluster.wait_leader()
    first, last, _ = await cluster.servers[leader].append([b"kept"], producer_id="p", sequence=0)
    await cluster.wait_converged()
    await cluster.stop()
    await cluster.start()
    leader = await cluster.wait_leader()
    assert (await cluster.servers[leader].append([b"kept"], producer_id="p", sequence=0))[:2] == (first, last)
    assert user_bodies(cluster, leader) == [b"kept"]


async def test_a_sequence_older_than_the_window_is_refused(cluster: Cluster):
    leader = cluster.servers[await cluster.wait_leader()]
    for server in cluster.servers.values():
        server.pusher.producers.sequences = 2
    for sequence in range(4):
        await leader.append([b"%d" % sequence], producer_id="p", sequence=sequence)
    with pytest.raises(DLedgerError) as e:
        await leader.append([b"0"], producer_id="p", sequence=0)
    assert e.value.code is ResponseCode.REPEATED_REQUEST


async def test_reads_hide_the_logs_own_entries_unless_asked(cluster: Cluster):
    leader = cluster.servers[await cluster.wait_leader()]
    await leader.append([b"user"], producer_id="p", sequence=0)

    async def read(include_system: bool) -> list[int]:
        batches = await leader.handle_read(pb.ReadRequest(start_index=-1, end_index=-1,
                                                          include_system=include_system))
        return [e.magic async for batch in batches for e in batch.entries]

    assert await read(False) == [MAGIC_NORMAL]
    assert set(await read(True)) == {MAGIC_NOOP, MAGIC_NORMAL, MAGIC_PRODUCER_MARK}


async def test_the_commit_index_never_stops_inside_an_idempotent_batch(tmp_path):
    # One entry per push: without the rule the watermarks, and so the commit
    # index, would walk through the batch one entry at a time.
    c = Cluster(str(tmp_path), max_push_batch_entries=1, max_inflight_pushes_per_peer=1)
    await c.start()
    try:
        leader = c.servers[await c.wait_leader()]
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(leader.member_state.committed_index)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        first, last, _ = await leader.append([b"%d" % i for i in range(30)], producer_id="p", sequence=0)
        watcher.cancel()
        mark = first - 1
        assert seen and not [index for index in seen if mark <= index < last]
    finally:
        await c.stop()


async def test_a_torn_batch_at_the_end_of_a_new_leaders_log_is_dropped(tmp_path):
    from dledger.store.file_store import DLedgerFileStore

    c = Cluster(str(tmp_path))
    await c.start()
    await c.wait_leader()
    await c.wait_converged()
    term = max(s.member_state.term for s in c.servers.values())
    await c.stop()
    # n0 holds the first half of a batch a leader of `term` was pushing when it died.
    store = DLedgerFileStore(c.configs["n0"])
    store.open()
    store.append_as_leader([encode_mark("p", 0, 3, 0), b"b1"], term, magics=[MAGIC_PRODUCER_MARK, MAGIC_NORMAL])
    store.close()
    await c.start("n0")
    await c.start("n1")
    new = await c.wait_leader()
    assert new == "n0"  # the longer log: n1 cannot win without n0's vote
    first, last, _ = await c.servers[new].append([b"b1", b"b2", b"b3"], producer_id="p", sequence=0)
    await c.start("n2")
    await c.wait_converged()
    for node in c.servers:
        assert user_bodies(c, node) == [b"b1", b"b2", b"b3"]
    await c.stop()


async def test_a_retry_outside_the_duplicate_window_is_refused_by_the_leader(cluster: Cluster):
    leader = cluster.servers[await cluster.wait_leader()]
    window_ms = cluster.configs[leader.config.self_id].producer_window_s * 1000
    await leader.append([b"a"], producer_id="p", sequence=0)
    # An evicted or never-seen producer's old retry: nothing can tell whether
    # it was appended, so it is not appended (again).
    with pytest.raises(DLedgerError) as e:
        await leader.append([b"b"], producer_id="q", sequence=0, retry_age_ms=int(window_ms) + 1)
    assert e.value.code is ResponseCode.REPEATED_REQUEST
    assert (await leader.append([b"a"], producer_id="p", sequence=0, retry_age_ms=int(window_ms) + 1))[0] >= 0
    await cluster.wait_converged()
    assert user_bodies(cluster, leader.config.self_id) == [b"a"]


def test_a_retry_from_an_unknown_producer_is_accepted_when_none_was_dropped_early():
    table = ProducerTable(window_ms=10_000)
    assert table.lookup("new", 1, retry_age_ms=50) is None       # e.g. its first attempt never arrived
    table.apply_mark(1, mark("a", 0, at_ms=1_000))
    assert table.lookup("new", 1, retry_age_ms=50) is None
