"""The message store on the replicated log: puts and pulls, offsets identical on
every replica, leader changes, restarts, retention and bad input."""
from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from broker.message_ids import MessageIdTable
from dledger.entry import HEADER_SIZE
from store.consume_queue import GetStatus
from store.errors import MessageTooLargeError, QueueIdError, StoreUnavailableError, TopicNotFoundError
from store.message_id import decode_offset_message_id
from store.subscription_group import SubscriptionGroupConfig
from store.topic_config import TopicConfig
from tests.unit.store_harness import StoreCluster, message
from tests.unit.test_repair import flip

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = StoreCluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


def copy_if_still_there(source: str, destination: str) -> None:
    """A temp file renamed away during the copy is simply not in the image."""
    try:
        shutil.copy2(source, destination)
    except FileNotFoundError:
        pass


def tree(path: str) -> dict[str, bytes]:
    found = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path)] = open(full, "rb").read()
    return found


async def test_a_put_is_pulled_back_with_dense_offsets_and_its_position(cluster: StoreCluster):
    await cluster.create_topic("Orders", queues=2)
    store = await cluster.leader_store()
    results = await store.put_messages([message("Orders", b"m%d" % i, queue_id=i % 2, tags="A") for i in range(10)])
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for result in results:
        host, physical = decode_offset_message_id(result.message_id)
        assert physical == result.physical_offset and host == store.commit_log.store_host
        entry = store.server.store.get(result.index)
        assert entry.pos + 48 == result.physical_offset
    await cluster.wait_applied()
    got = store.get_messages("Orders", 1, 0, 100)
    assert got.status is GetStatus.FOUND
    assert [m.body for m in got.messages] == [b"m%d" % i for i in range(1, 10, 2)]
    assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3, 4]
    assert all(m.physical_offset == r.physical_offset for m, r in zip(got.messages, results[1::2]))
    assert got.next_offset == 5 and got.max_offset == 5


async def test_every_replica_derives_identical_queues_index_and_metadata(cluster: StoreCluster):
    await cluster.create_topic("T", queues=3)
    store = await cluster.leader_store()
    await store.update_group(SubscriptionGroupConfig("g1", retry_max_times=3))
    for round_ in range(5):
        await store.put_messages([message("T", os.urandom(300), queue_id=i % 3, tags=f"tag{i % 2}",
                                          keys=f"k{round_}-{i}") for i in range(40)])
    await store.commit_offsets([("g1", "T", 0, 7), ("g1", "T", 2, 3)])
    dirs = {n: s.config.store_dir for n, s in cluster.stores.items()}
    names = ("topics.json", "subscriptionGroup.json", "consumerOffset.json")
    for _ in range(20):
        # The leader may write a metadata snapshot at any moment: compare once
        # every replica has applied the same entries.
        await cluster.wait_applied()
        for s in cluster.stores.values():
            await s.flush()
            await s.persist_configs(force=True)
        contents = {name: {n: json.load(open(os.path.join(d, "config", name))) for n, d in dirs.items()}
                    for name in names}
        if all(c["n0"] == c["n1"] == c["n2"] for c in contents.values()):
            break
        await asyncio.sleep(0.2)
    for name, by_node in contents.items():
        assert by_node["n0"] == by_node["n1"] == by_node["n2"], name
    queues = {n: tree(os.path.join(d, "consumequeue")) for n, d in dirs.items()}
    assert queues["n0"] == queues["n1"] == queues["n2"] and queues["n0"]
    answers = {n: [m.body for m in s.query_messages("T", "k3-7", 10, 0, 2**62)] for n, s in cluster.stores.items()}
    assert answers["n0"] == answers["n1"] == answers["n2"] and len(answers["n0"]) == 1
    assert all(s.offsets.query("g1", "T", 0) == 7 for s in cluster.stores.values())
    assert all(s.groups.get("g1").retry_max_times == 3 for s in cluster.stores.values())


async def test_a_leader_change_during_writes_leaves_no_gap_or_duplicate_offset(cluster: StoreCluster):
    await cluster.create_topic("T", queues=1)
    acked: dict[int, bytes] = {}

    async def writer() -> None:
        for i in range(200):
            try:
                store = cluster.stores[await cluster.wait_leader()]
                result = (await store.put_messages([message("T", b"%d" % i)]))[0]
                acked[result.queue_offset] = b"%d" % i
            except Exception:  # noqa: BLE001 - unknown outcome: may or may not be stored
                await asyncio.sleep(0.02)

    task = asyncio.ensure_future(writer())
    await asyncio.sleep(0.3)
    old = await cluster.wait_leader()
    cluster.network.isolate(old)
    await asyncio.sleep(0.5)
    cluster.network.heal()
    await task
    await cluster.wait_applied()
    for node, store in cluster.stores.items():
        got = store.get_messages("T", 0, 0, 1000)
        offsets = [m.queue_offset for m in got.messages]
        assert offsets == list(range(len(offsets))), node  # dense, no duplicate
        by_offset = {m.queue_offset: m.body for m in got.messages}
        assert all(by_offset.get(o) == b for o, b in acked.items()), node  # nothing acknowledged lost
    bodies = {n: [m.body for m in s.get_messages("T", 0, 0, 1000).messages] for n, s in cluster.stores.items()}
    assert bodies["n0"] == bodies["n1"] == bodies["n2"]


async def test_a_restarted_node_resumes_from_its_checkpoint_and_matches_the_leader(cluster: StoreCluster):
    await cluster.create_topic("T", queues=2)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"a%d" % i, queue_id=i % 2) for i in range(30)])
    await cluster.wait_applied()
    follower = next(n for n in cluster.stores if cluster.servers[n].member_state.role.value != "LEADER")
    await cluster.stop(follower)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"b%d" % i, queue_id=i % 2) for i in range(30)])
    await cluster.start(follower)
    await cluster.wait_applied()
    leader = await cluster.wait_leader()
    for queue_id in (0, 1):
        want = [m.body for m in cluster.stores[leader].get_messages("T", queue_id, 0, 100).messages]
        assert [m.body for m in cluster.stores[follower].get_messages("T", queue_id, 0, 100).messages] == want
        assert len(want) == 30


async def test_metadata_written_on_the_leader_is_known_to_a_new_leader(cluster: StoreCluster):
    store = await cluster.leader_store()
    await store.update_topic(TopicConfig("Kept", read_queue_nums=5, write_queue_nums=5))
    await store.delete_topic("Kept")
    await store.update_topic(TopicConfig("Kept2", read_queue_nums=2, write_queue_nums=2))
    old = await cluster.wait_leader()
    term = cluster.servers[old].member_state.term
    await cluster.wait_applied()
    await cluster.stop(old)
    new = await cluster.wait_leader(min_term=term + 1)
    assert cluster.stores[new].topics.get("Kept") is None
    assert cluster.stores[new].topics.get("Kept2").write_queue_nums == 2


async def test_a_leader_that_loses_its_quorum_while_writing_a_metadata_snapshot_keeps_running(tmp_path):
    # The snapshot task once died of the append's NOT_LEADER / TERM_CHANGED,
    # and a node whose long-lived task dies stops itself: two nodes of a
    # cluster under leadership churn stopped that way.
    c = StoreCluster(str(tmp_path), store={"metadata_snapshot_interval_s": 0.2})
    await c.start()
    try:
        await c.create_topic("T", queues=1)
        leader = await c.wait_leader()
        store = c.stores[leader]
        term = c.servers[leader].member_state.term
        for follower in [n for n in c.servers if n != leader]:
            await c.stop(follower)
        # Every second the task finds a snapshot due (the interval is 0.2 s)
        # and tries to append it without a quorum, until the leader steps down.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while c.servers[leader].member_state.is_leader and loop.time() < deadline:
            await asyncio.sleep(0.1)
        assert not c.servers[leader].member_state.is_leader, "the leader kept leading without a quorum"
        await asyncio.sleep(1.5)   # one more round of the task, now as a follower
        snapshot_task = next(t for t in store._tasks if t.get_name() == "MetadataSnapshot")
        assert not snapshot_task.done(), snapshot_task.exception()
        assert c.servers[leader].member_state.term >= term
    finally:
        await c.stop()


async def test_consumed_offsets_moving_do_not_make_a_metadata_snapshot_due_but_a_topic_change_does(tmp_path):
    # While a group consumes, its offsets (and the broker's pop state) change
    # all the time; a whole-state snapshot entry every second would follow.
    c = StoreCluster(str(tmp_path), store={"metadata_snapshot_interval_s": 3600.0})
    await c.start()
    try:
        await c.create_topic("T", queues=2)
        store = await c.leader_store()
        await store._maybe_snapshot_metadata()
        last = store.snapshots.last_index
        assert last >= store.topics.applied_index
        for offset in range(1, 4):
            await store.commit_offsets([("G", "T", 0, offset), ("G", "T", 1, offset)])
            await store._maybe_snapshot_metadata()
        assert store.offsets.query("G", "T", 1) == 3 and store.offsets.applied_index > last
        assert store.snapshots.last_index == last
        await store.update_topic(TopicConfig("T2", read_queue_nums=1, write_queue_nums=1))
        await store._maybe_snapshot_metadata()
        assert store.snapshots.last_index > last
    finally:
        await c.stop()


async def test_replicas_with_the_whole_history_keep_their_own_state_when_a_snapshot_is_applied(cluster: StoreCluster):
    # Their state already is the snapshot's: decoding it again (a million
    # leases: 1.5 s) would stall every node at every snapshot.
    await cluster.create_topic("Kept", queues=2)
    await cluster.wait_applied()
    tables = {node: store.topics.topics for node, store in cluster.stores.items()}
    store = await cluster.leader_store()
    before = store.snapshots.last_index
    assert await store.write_metadata_snapshot()
    await cluster.wait_applied()
    for node, replica in cluster.stores.items():
        assert replica.snapshots.last_index > before, node
        assert replica.topics.topics is tables[node] and replica.topics.get("Kept") is not None, node
        assert replica.topics.applied_index == replica.snapshots.last_index, node


async def test_bad_puts_are_refused_and_write_nothing(cluster: StoreCluster):
    await cluster.create_topic("T", queues=2)
    store = await cluster.leader_store()
    end = store.server.store.ledger_end_index
    with pytest.raises(TopicNotFoundError):
        await store.put_messages([message("Nope", b"x")])
    with pytest.raises(QueueIdError):
        await store.put_messages([message("T", b"x", queue_id=2)])
    with pytest.raises(MessageTooLargeError):
        await store.put_messages([message("T", b"x" * (4 * 1024 * 1024 + 1))])
    assert store.server.store.ledger_end_index == end
    leader = await cluster.wait_leader()
    follower = next(n for n in cluster.stores if n != leader)
    with pytest.raises(StoreUnavailableError) as refused:
        await cluster.stores[follower].put_messages([message("T", b"x")])
    assert refused.value.leader_id == leader
    assert store.get_messages("T", 0, 5, 10).status is GetStatus.NO_MESSAGE_IN_QUEUE


async def test_a_message_is_found_by_its_offset_id_by_its_client_id_and_by_key(cluster: StoreCluster):
    await cluster.create_topic("T", queues=2)
    store = await cluster.leader_store()
    results = await store.put_messages([message("T", b"m%d" % i, queue_id=i % 2, keys=f"order-{i} shared",
                                                uniq_key=f"01{i:032X}") for i in range(6)])
    await cluster.wait_applied()
    for node_store in cluster.stores.values():
        assert node_store.query_message_by_id(results[3].message_id).body == b"m3"
        assert node_store.query_message_by_id(f"01{4:032X}", topic="T").body == b"m4"
        assert node_store.query_message_by_id(f"01{99:032X}", topic="T") is None
        assert [m.body for m in node_store.query_messages("T", "shared", 10, 0, 2**62)] == \
            [b"m%d" % i for i in reversed(range(6))]


async def test_a_pull_beyond_the_queue_says_where_it_ends(cluster: StoreCluster):
    await cluster.create_topic("T", queues=1)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"x") for _ in range(3)])
    await cluster.wait_applied()
    at_end = store.get_messages("T", 0, 3, 10)
    assert at_end.status is GetStatus.OFFSET_OVERFLOW_ONE and at_end.next_offset == 3
    beyond = store.get_messages("T", 0, 9, 10)
    assert beyond.status is GetStatus.OFFSET_OVERFLOW_BADLY and beyond.next_offset == 3


async def test_tag_filtering_and_offset_by_time(cluster: StoreCluster):
    await cluster.create_topic("T", queues=1)
    store = await cluster.leader_store()
    first = await store.put_messages([message("T", b"a", tags="A"), message("T", b"b", tags="B")])
    await asyncio.sleep(0.01)
    later = await store.put_messages([message("T", b"c", tags="A")])
    await cluster.wait_applied()
    from store.java_hash import tag_hash_code
    got = store.get_messages("T", 0, 0, 10, tag_hashes={tag_hash_code("A")})
    assert [m.body for m in got.messages] == [b"a", b"c"]
    assert store.offset_by_time("T", 0, later[0].store_timestamp) == 2
    assert store.offset_by_time("T", 0, first[0].store_timestamp) == 0
    assert store.offset_by_time("T", 0, later[0].store_timestamp + 1) == 3


async def test_retention_moves_queue_minimums_and_a_pull_below_is_told_the_new_minimum(tmp_path):
    c = StoreCluster(str(tmp_path), data_file_size=16 * 1024, max_entry_size=8 * 1024, retention_s=0.0,
                     retention_check_interval_s=0.2,
                     store={"clean_interval_s": 0.2})
    await c.start()
    try:
        await c.create_topic("T", queues=1)
        store = await c.leader_store()
        for _ in range(12):
            await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])
        await c.wait_applied()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while loop.time() < deadline and store.min_offset("T", 0) == 0:
            await asyncio.sleep(0.1)
        minimum = store.min_offset("T", 0)
        assert minimum > 0, "retention never moved the queue's minimum"
        moved = store.get_messages("T", 0, 0, 10)
        assert moved.status is GetStatus.OFFSET_TOO_SMALL and moved.next_offset == minimum
        assert store.get_messages("T", 0, minimum, 1).messages[0].queue_offset == minimum
    finally:
        await c.stop()


async def test_a_crash_image_recovers_queues_that_never_point_past_the_committed_log(tmp_path):
    live = StoreCluster(str(tmp_path / "live"))
    await live.start()
    try:
        await live.create_topic("T", queues=1)
        store = await live.leader_store()
        acked = []
        for i in range(20):
            acked += [m for m in await store.put_messages([message("T", b"x%d-%d" % (i, j)) for j in range(5)])]
        # What SIGKILL of every node right now leaves: the files as written,
        # no final flush, no checkpoint or snapshot at shutdown, abort present.
        # (in a thread: the three nodes share this event loop, and a long
        # copy on it would stall their heartbeats into an election)
        await asyncio.to_thread(shutil.copytree, tmp_path / "live", tmp_path / "crashed",
                                copy_function=copy_if_still_there)
    finally:
        await live.stop()
    assert all(os.path.exists(tmp_path / "crashed" / n / "store" / "abort") for n in ("n0", "n1", "n2"))
    crashed = StoreCluster(str(tmp_path / "crashed"))
    await crashed.start()
    try:
        await crashed.wait_leader()
        await crashed.wait_applied()
        for node, recovered in crashed.stores.items():
            got = recovered.get_messages("T", 0, 0, 1000).messages
            assert [m.queue_offset for m in got] == list(range(len(got))), node
            assert [m.body for m in got][:len(acked)] == [b"x%d-%d" % (i, j) for i in range(20) for j in range(5)]
            end = recovered.commit_log.committed_end() + 48
            assert all(u.phys_offset < end for u in recovered.consume_queues.get("T", 0).get(0, 1000).units)
    finally:
        await crashed.stop()


@pytest.mark.parametrize("lost", ["disk", "store"])
async def test_a_node_with_a_new_disk_learns_topics_from_a_snapshot_after_retention(tmp_path, lost: str):
    # "disk": the whole data directory is new, and the leader resets the
    # node's log to its own first entry; "store": the log survived but the
    # store's files (checkpoint, topics.json) did not, and the log no longer
    # holds the entries that created the topic.
    c = StoreCluster(str(tmp_path), data_file_size=16 * 1024, max_entry_size=8 * 1024, retention_s=0.0,
                     retention_check_interval_s=0.2, store={"clean_interval_s": 0.2})
    await c.start()
    try:
        await c.create_topic("T", queues=1)
        store = await c.leader_store()
        created_at = store.topics.applied_index
        for _ in range(12):
            await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])
        assert await store.write_metadata_snapshot()
        for _ in range(8):
            await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])
        leader = await c.wait_leader()
        victim = next(n for n in c.servers if n != leader)
        # With only the store lost, the victim's own log must be cut as well,
        # or the topic would come back from its log rather than the snapshot.
        await c.wait_log_cut([leader, victim], past=created_at)
        await c.stop(victim)
        lost_dir = c.configs[victim].data_dir
        shutil.rmtree(lost_dir if lost == "disk" else os.path.join(lost_dir, "store"))
        await c.start(victim)
        await c.wait_applied(timeout=10)
        fresh = c.stores[victim]
        assert fresh.topics.get("T") is not None and fresh.topics.get("T").write_queue_nums == 1
        assert fresh.snapshots.incomplete == set()   # restored from the snapshot, whole since
        first = fresh.min_offset("T", 0)
        assert first > 0
        # Retention (every 0.2 s, nothing kept for time) goes on cutting both
        # logs: compare what both still hold, read without yielding the loop.
        held = max(first, store.min_offset("T", 0))
        got = fresh.get_messages("T", 0, held, 1000).messages
        assert [m.queue_offset for m in got] == list(range(held, fresh.max_offset("T", 0)))
        assert got == store.get_messages("T", 0, held, 1000).messages
    finally:
        await c.stop()


async def test_a_crash_between_checkpoint_and_config_snapshot_replays_what_the_snapshots_lack(tmp_path):
    # Checkpoints every 50 ms, JSON snapshots never (until shutdown): the
    # checkpoint must not claim entries whose effect only lives in memory.
    live = StoreCluster(str(tmp_path / "live"), store={"config_persist_interval_s": 3600.0})
    await live.start()
    try:
        await live.create_topic("Created", queues=3)
        store = await live.leader_store()
        await store.commit_offsets([("g", "Created", 1, 42)])
        await live.wait_applied()
        await asyncio.sleep(0.3)  # several checkpoints
        shutil.copytree(tmp_path / "live", tmp_path / "crashed", copy_function=copy_if_still_there)
    finally:
        await live.stop()
    crashed = StoreCluster(str(tmp_path / "crashed"))
    await crashed.start()
    try:
        await crashed.wait_leader()
        await crashed.wait_applied()
        for node, recovered in crashed.stores.items():
            assert recovered.topics.get("Created") is not None, node
            assert recovered.offsets.query("g", "Created", 1) == 42, node
    finally:
        await crashed.stop()


async def test_raw_log_appends_shaped_like_store_entries_never_change_or_stop_the_store(cluster: StoreCluster):
    from dledger.entry import CHANNEL_STATE_MACHINE, MAGIC_NORMAL
    from store.system_entry import SystemKind, encode_system_entry
    from store.topic_config import topic_delete_payload
    await cluster.create_topic("T", queues=1)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"kept")])
    await cluster.wait_applied()
    log_store = store.server.store
    own = [e for e in log_store.read_entries(log_store.ledger_begin_index, log_store.ledger_end_index, 1 << 20)
           if e.magic == MAGIC_NORMAL]
    assert own and all(e.channel == CHANNEL_STATE_MACHINE for e in own)
    forged = [
        b"AAAASYSE hello",                                              # a system header that lies about its size
        b"\x00\x00\x00\x0aSYSE",                                         # a system header and nothing else
        encode_system_entry(SystemKind.TOPIC_DELETE, topic_delete_payload("T")),
        encode_system_entry(SystemKind.BROKER_BASE + 7, {"anything": 1}),
        *[e.body for e in own],                                          # every entry the store wrote, replayed
        os.urandom(200),
    ]
    for body in forged:
        await store.server.append([body])  # the log API's path: channel 0
    await store.put_messages([message("T", b"after")])
    await cluster.wait_applied()
    for node, replica in cluster.stores.items():
        assert replica.reput.failure is None, node
        assert replica.reput.raw_entries == len(forged), node
        assert replica.topics.get("T") is not None, node
        got = replica.get_messages("T", 0, 0, 100)
        assert [m.body for m in got.messages] == [b"kept", b"after"], node
    dirs = {n: s.config.store_dir for n, s in cluster.stores.items()}
    queues = {n: tree(os.path.join(d, "consumequeue")) for n, d in dirs.items()}
    assert queues["n0"] == queues["n1"] == queues["n2"]


async def test_a_store_derived_before_entries_were_tagged_starts_only_in_legacy_mode(tmp_path):
    from store.errors import StoreStartError
    from store.store_checkpoint import ENTRY_FORMAT_UNTAGGED, StoreCheckpoint
    cluster = StoreCluster(str(tmp_path))
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=1)
        await cluster.wait_applied()
        leader = await cluster.wait_leader()
        victim = next(n for n in cluster.stores if n != leader)
        path = os.path.join(cluster.stores[victim].config.store_dir, "checkpoint")
        await cluster.stop(victim)
        old = StoreCheckpoint.load(path)
        assert old is not None and old.applied_index >= 0
        old.entry_format = ENTRY_FORMAT_UNTAGGED  # what an older version's file holds at offset 48
        old.save(path)
        with pytest.raises(StoreStartError, match="legacy_untagged_entries"):
            await cluster.start(victim)
        await cluster.stop(victim)
        cluster.reconfigure_store(legacy_untagged_entries=True)
        await cluster.start(victim)
        await cluster.wait_applied()
        assert cluster.stores[victim].topics.get("T") is not None
    finally:
        await cluster.stop()


async def test_a_node_whose_apply_loop_stopped_hands_leadership_to_one_whose_store_works(tmp_path):
    """Its broker would answer every client with an error: it steps down, does
    not campaign, and a node whose store works leads and takes writes."""
    from store.errors import StoreFailedError
    cluster = StoreCluster(str(tmp_path))
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=1)
        leader = await cluster.wait_leader()
        cluster.stores[leader].reput.failure = StoreFailedError("entry 7: a decoding bug (injected)")
        new = await cluster.wait_leader(among=[n for n in cluster.servers if n != leader], timeout=10)
        await cluster.stores[new].put_messages([message("T", b"after")])
        await asyncio.sleep(1.5)     # several election timeouts: it never takes leadership back
        assert not cluster.servers[leader].member_state.is_leader
    finally:
        await cluster.stop()


def byte_in_entry(log_store, needle: bytes, offset: int) -> tuple[str, int]:
    """The segment file and position of the byte `offset` after `needle`,
    in the entry that holds it."""
    index = next(i for i in range(log_store.ledger_end_index + 1) if needle in log_store.get(i).body)
    pos = log_store.position_of(index)
    segment = log_store._data.find(pos)
    return segment.path, pos - segment.start + HEADER_SIZE + log_store.get(index).body.index(needle) + offset


async def test_an_entry_damaged_on_disk_is_repaired_before_a_replay_applies_it(cluster: StoreCluster):
    # Entries were CRC-checked when they entered the log, but a store that
    # derives its state again replays them from disk. In a 10-minute broker
    # chaos run a bit flipped in a transaction's commit was applied so: its
    # half message stayed undecided and was committed a second time.
    await cluster.create_topic("T", queues=1)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"m%d" % i, keys=f"order-{i:03d}") for i in range(20)])
    await cluster.wait_applied()
    await asyncio.sleep(1.5)   # checkpointed: a flip behind the checkpoint is not looked for at open
    follower = next(n for n in cluster.stores if not cluster.servers[n].member_state.is_leader)
    damaged = byte_in_entry(cluster.servers[follower].store, b"order-010", 6)
    await cluster.stop(follower)
    shutil.rmtree(os.path.join(cluster.configs[follower].data_dir, "store"))  # derived again from the log
    flip(*damaged, bit=0x01)     # order-010 -> order-011 in this copy
    await cluster.start(follower)
    await cluster.wait_applied(timeout=15)
    replica = cluster.stores[follower]
    assert cluster.servers[follower].repairs == 1 and replica.reput.failure is None
    assert [m.body for m in replica.query_messages("T", "order-010", 10, 0, 2**62)] == [b"m10"]
    assert [m.body for m in replica.query_messages("T", "order-011", 10, 0, 2**62)] == [b"m11"]


async def test_the_message_id_table_rebuilt_at_start_reads_no_damaged_entry(cluster: StoreCluster):
    # The broker's id table (duplicate sends) is read back from the log for
    # the window before the entry the store resumes after; a flipped id there
    # would make another send look repeated. The entry is repaired first.
    await cluster.create_topic("T", queues=1)
    store = await cluster.leader_store()
    await store.put_messages([message("T", b"m%d" % i, uniq_key=f"ID-{i:03d}") for i in range(20)])
    await cluster.wait_applied()
    await asyncio.sleep(1.5)   # checkpointed: the restarted store resumes after every entry
    follower = next(n for n in cluster.stores if not cluster.servers[n].member_state.is_leader)
    damaged = byte_in_entry(cluster.servers[follower].store, b"ID-010", 5)
    await cluster.stop(follower)
    flip(*damaged, bit=0x01)     # ID-010 -> ID-011 in this copy
    await cluster.start(follower)
    replica = cluster.stores[follower]
    table = MessageIdTable(window=1000)
    rebuilt = await asyncio.wait_for(table.rebuild(cluster.servers[follower], replica.applied_index, 1 << 20), 15)
    assert rebuilt == 20 and cluster.servers[follower].repairs == 1
    assert table.get("T", "ID-010").queue_offset == 10 and table.get("T", "ID-011").queue_offset == 11
