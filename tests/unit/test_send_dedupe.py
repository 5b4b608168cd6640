"""A producer's retry (same message id) is never stored twice, in the two
windows where the message-id table could miss it: between a put's commit and
its apply on the leader, and on a new leader that has not applied the log up
to its term yet."""
from __future__ import annotations

import asyncio
import contextlib
import gc
from types import SimpleNamespace

import pytest

from broker.message_ids import MessageIdTable, StoredMessage
from store import codec
from store.commit_log import DLEDGER_HEADER_SIZE

from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from tests.unit.broker_harness import BrokerCluster, protocol_message

pytestmark = pytest.mark.timeout(60)


@contextlib.contextmanager
def apply_paused(store):
    """Hold a node's apply loop still (committed entries wait to be applied)."""
    reput = store.reput
    real = reput.apply_available
    reput.apply_available = lambda committed: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        reput.apply_available = real  # type: ignore[method-assign]


def copies(cluster: BrokerCluster, node: str, topic: str) -> list[bytes]:
    store = cluster.stores[node]
    return [m.body for q in range(8) for m in store.get_messages(topic, q, 0, 100).messages]


@pytest.fixture
async def cluster(tmp_path):
    c = BrokerCluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


async def test_a_retry_between_commit_and_apply_is_answered_not_stored(cluster: BrokerCluster):
    leader = await cluster.wait_leader()
    broker = cluster.brokers[leader]
    await broker.sender.send([protocol_message("Dedupe", b"warm-up")])  # creates the topic
    await cluster.wait_applied()
    message = protocol_message("Dedupe", b"once")
    with apply_paused(cluster.stores[leader]):
        first = await broker.sender.send([message])          # committed, not yet applied here
        again = await broker.sender.send([message])          # the producer's retry
    assert first.status.code == again.status.code == pb.OK
    assert again.entries[0].offset == first.entries[0].offset
    await cluster.wait_applied()
    assert copies(cluster, leader, "Dedupe").count(b"once") == 1


async def test_a_retry_at_a_new_leader_still_applying_is_answered_not_stored(cluster: BrokerCluster):
    old = await cluster.wait_leader()
    await cluster.brokers[old].sender.send([protocol_message("Dedupe", b"warm-up")])
    message = protocol_message("Dedupe", b"once")
    first = await cluster.brokers[old].sender.send([message])
    await cluster.wait_applied()
    term = cluster.servers[old].member_state.term
    # The new leader has the message in its log but has not applied it when
    # the producer's retry arrives (as when the old leader dies before its
    # answer left).
    others = [n for n in cluster.servers if n != old]
    message_id = message.system_properties.message_id
    for node in others:
        reput = cluster.stores[node].reput
        stored_at = next(i for i in range(reput.applied_index, -1, -1)
                         if message_id.encode() in cluster.servers[node].store.get(i).body)
        reput.progress.applied_index = reput._dispatched = stored_at - 1  # applied up to just before it...
        for _, held in cluster.brokers[node].sender.recent._ids._slices:  # ...so not known yet
            held.pop(("Dedupe", message_id), None)
    pauses = [apply_paused(cluster.stores[n]) for n in others]
    for pause in pauses:
        pause.__enter__()
    await cluster.stop(old)
    new = await _new_leader(cluster, others, term)
    retry = asyncio.ensure_future(cluster.brokers[new].sender.send([message]))
    await asyncio.sleep(0.3)                                  # the retry is waiting; the apply resumes
    for pause in pauses:
        pause.__exit__(None, None, None)
    again = await retry
    assert again.status.code == pb.OK, again.status
    assert again.entries[0].offset == first.entries[0].offset
    await cluster.wait_applied()
    assert copies(cluster, new, "Dedupe").count(b"once") == 1


async def _new_leader(cluster: BrokerCluster, candidates: list[str], term: int) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while loop.time() < deadline:
        leaders = [n for n in candidates if cluster.servers[n].member_state.is_leader
                   and cluster.servers[n].member_state.term > term]
        if leaders:
            return leaders[0]
        await asyncio.sleep(0.02)
    raise AssertionError(cluster.describe())


async def test_a_retry_after_every_node_restarted_from_its_checkpoint_is_answered_not_stored(cluster: BrokerCluster):
    # The table was only derived from messages applied since the start: a
    # node restarted from a checkpoint past the message forgot it, and stored
    # the producer's retry a second time.
    leader = await cluster.wait_leader()
    message = protocol_message("Dedupe", b"once")
    first = await cluster.brokers[leader].sender.send([message])
    await cluster.wait_applied()
    for store in cluster.stores.values():
        await store.persist_configs(force=True)
        await store.flush()                     # the checkpoint now covers the message
    await cluster.stop()
    await cluster.start()
    new = await cluster.wait_leader()
    assert cluster.stores[new].checkpoint.applied_index >= first_index(cluster, new, message)
    again = await cluster.brokers[new].sender.send([message])
    assert again.status.code == pb.OK, again.status
    assert again.entries[0].offset == first.entries[0].offset
    await cluster.wait_applied()
    assert copies(cluster, new, "Dedupe").count(b"once") == 1
    tables = [list(broker.sender.recent.rows()) for broker in cluster.brokers.values()]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 1


def test_the_table_holds_the_messages_of_the_last_window_of_entries():
    table = MessageIdTable(window=3)
    for index in (10, 11, 13):
        table.on_arrival(SimpleNamespace(uniq_key=f"id{index}", topic="T", queue_id=0, queue_offset=index,
                                         physical_offset=index), index)
    assert [table.get("T", f"id{i}") is not None for i in (10, 11, 13)] == [False, True, True]
    # Over many windows: always exactly the last window's ids, and the
    # generations that hold them stay few.
    table = MessageIdTable(window=100)
    for index in range(1_000):
        table.on_arrival(SimpleNamespace(uniq_key=f"id{index}", topic="T", queue_id=0, queue_offset=index,
                                         physical_offset=index), index)
        if index % 37 == 0:
            known = [i for i in range(index + 1) if table.get("T", f"id{i}") is not None]
            assert known == list(range(max(0, index - 99), index + 1))
            assert [row[0] for _, row in table.rows()] == known
    assert len(table._ids._slices) <= 6


def first_index(cluster: BrokerCluster, node: str, message) -> int:
    log_store = cluster.servers[node].store
    message_id = message.system_properties.message_id.encode()
    return next(i for i in range(log_store.ledger_begin_index, log_store.ledger_end_index + 1)
                if message_id in log_store.get(i).body)


async def test_a_log_clients_append_shaped_like_a_message_is_not_read_back_as_one(cluster: BrokerCluster):
    # The rebuild reads the log as the apply loop does: a raw append that
    # copies a stored message's bytes (its id included) is not a message.
    leader = await cluster.wait_leader()
    message = protocol_message("Dedupe", b"once")
    await cluster.brokers[leader].sender.send([message])
    await cluster.wait_applied()
    log_store = cluster.servers[leader].store
    forged = bytearray(log_store.get(first_index(cluster, leader, message)).body)

    def place(positions: list[int]) -> None:  # a forger who guessed where it lands
        codec.patch_offsets(forged, 0, positions[0] + DLEDGER_HEADER_SIZE)

    await cluster.servers[leader].append([forged], prepare=place)   # the Append RPC's channel
    await cluster.wait_applied()
    table = MessageIdTable(window=1000)
    await table.rebuild(cluster.servers[leader], cluster.stores[leader].applied_index, 1 << 20)
    assert [row[0] for _, row in table.rows()] == [first_index(cluster, leader, message)]


async def test_a_retry_of_a_delayed_message_due_by_then_is_answered_not_stored(cluster: BrokerCluster):
    from google.protobuf.timestamp_pb2 import Timestamp
    leader = await cluster.wait_leader()
    broker = cluster.brokers[leader]
    await broker.sender.send([protocol_message("Later", b"warm-up")])
    due = Timestamp()
    due.FromMilliseconds(cluster.clock() + 2000)
    message = protocol_message("Later", b"once", delivery_timestamp=due, message_type=pb.DELAY)
    first = await broker.sender.send([message])               # into the timer topic
    assert first.status.code == pb.OK
    cluster.clock.advance(5000)                               # due now: a retry would go straight to the topic
    again = await broker.sender.send([message])
    assert again.status.code == pb.OK, again.status
    await cluster.eventually(lambda: b"once" in copies(cluster, leader, "Later"), what="the timer delivers it")
    await asyncio.sleep(0.5)
    await cluster.wait_applied()
    assert copies(cluster, leader, "Later").count(b"once") == 1


async def test_a_retry_after_the_first_call_was_cancelled_mid_put_is_answered_not_stored(tmp_path):
    # The client's deadline ends the first SendMessage (gRPC cancels its
    # handler) while the put waits for a slow quorum: the entry is written.
    # The retry, same leader, same term, before the first copy commits, must
    # find it (found by the 10-minute broker chaos run: 16 such duplicates).
    cluster = BrokerCluster(str(tmp_path), max_wait_ack_s=5.0, election_timeout_min_s=3.0,
                            election_timeout_max_s=4.0)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        broker = cluster.brokers[leader]
        await broker.sender.send([protocol_message("Cancelled", b"warm-up")])
        await cluster.wait_applied()
        message = protocol_message("Cancelled", b"once")
        term = cluster.servers[leader].member_state.term
        cluster.network.isolate(leader)
        first = asyncio.ensure_future(broker.sender.send([message]))
        await asyncio.sleep(0.3)                                # written, waiting for a quorum
        first.cancel()                                          # the caller's deadline
        with contextlib.suppress(asyncio.CancelledError):
            await first
        cluster.network.heal()
        again = await broker.sender.send([message])             # the producer's retry
        assert cluster.servers[leader].member_state.term == term
        assert again.status.code == pb.OK, again.status
        await cluster.wait_applied()
        assert copies(cluster, leader, "Cancelled").count(b"once") == 1
    finally:
        await cluster.stop()


@pytest.mark.parametrize("delayed", [False, True], ids=["normal", "delayed-and-due-by-the-retry"])
async def test_a_retry_after_an_unknown_outcome_in_the_same_term_is_answered_not_stored(tmp_path, delayed: bool):
    # The leader writes the send, loses its followers before the commit (the
    # client hears "outcome unknown"), gets them back, and the retry comes to
    # the same leader in the same term before the first copy has committed.
    # Delayed: the first copy went to the timer topic and the retry comes
    # once the message is due, so it would go straight to its topic; the
    # doubt must be settled by looking in the timer topics too (a 10-minute
    # broker chaos run stored one such message twice).
    from google.protobuf.timestamp_pb2 import Timestamp
    cluster = BrokerCluster(str(tmp_path), max_wait_ack_s=0.5, election_timeout_min_s=3.0,
                            election_timeout_max_s=4.0)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        broker = cluster.brokers[leader]
        extra: dict[str, object] = {}
        if delayed:
            due = Timestamp()
            due.FromMilliseconds(cluster.clock() + 2000)
            extra = dict(delivery_timestamp=due, message_type=pb.DELAY)
        # The warm-up creates the topic (and the timer topic).
        await broker.sender.send([protocol_message("Doubt", b"warm-up", **extra)])
        await cluster.wait_applied()
        message = protocol_message("Doubt", b"once", **extra)
        term = cluster.servers[leader].member_state.term
        cluster.network.isolate(leader)
        first = await broker.sender.send([message])
        assert first.status.code != pb.OK                       # written, commit not seen: outcome unknown
        cluster.network.heal()
        if delayed:
            cluster.clock.advance(5000)                         # due now
        again = await broker.sender.send([message])             # the producer's retry, same leader, same term
        assert cluster.servers[leader].member_state.term == term
        assert again.status.code == pb.OK, again.status
        if delayed:
            await cluster.eventually(lambda: b"once" in copies(cluster, leader, "Doubt"), what="the timer delivers it")
            await asyncio.sleep(0.5)
        await cluster.wait_applied()
        assert copies(cluster, leader, "Doubt").count(b"once") == 1
    finally:
        await cluster.stop()


def test_the_tables_rows_are_not_walked_by_the_garbage_collector():
    # 200,000 ids (a full window) on every replica: as objects they made every
    # full collection a stall of over 100 ms on a busy machine.
    table = MessageIdTable(window=1_000)
    for index in range(1_000):
        table.on_arrival(SimpleNamespace(uniq_key=f"id{index}", topic="T", queue_id=1, queue_offset=index,
                                         physical_offset=10 * index), index)
    gc.collect()
    assert table._ids._slices and not any(gc.is_tracked(held) for _, held in table._ids._slices)
    assert table.get("T", "id7") == StoredMessage(1, 7, 70, "T")
