"""Timed messages on a three-node cluster over the in-memory network, with a
wall clock the test moves: the leader delivers each timer once, every replica
forgets it, a new leader neither loses nor repeats a delivery, and a recall
holds across a leader change."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store import message_const as mc
from tests.unit.broker_harness import BrokerCluster, protocol_message

pytestmark = pytest.mark.timeout(90)
QUEUES = 2


@pytest.fixture
async def cluster(tmp_path):
    c = BrokerCluster(str(tmp_path))
    await c.start()
    await c.create_topic("T", queues=QUEUES)
    yield c
    await c.stop()


def at(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


async def send_timed(cluster: BrokerCluster, bodies: list[bytes], delay_ms: int) -> list[str]:
    broker = await cluster.leader_broker()
    due = cluster.clock() + delay_ms
    answer = await broker.sender.send([protocol_message("T", body, delivery_timestamp=at(due), message_type=pb.DELAY)
                                       for body in bodies])
    assert answer.status.code == pb.OK, answer.status.message
    return [entry.recall_handle for entry in answer.entries]


def delivered_on(cluster: BrokerCluster, node: str) -> Counter[bytes]:
    store = cluster.stores[node]
    return Counter(m.body for q in range(QUEUES) for m in store.get_messages("T", q, 0, 10_000).messages)


def pending_everywhere(cluster: BrokerCluster) -> list[int]:
    return [len(b.timers.state) for b in cluster.brokers.values()]


async def test_a_timer_is_invisible_until_due_then_delivered_once_and_forgotten_by_every_replica(
        cluster: BrokerCluster):
    bodies = [b"t%d" % i for i in range(20)]
    await send_timed(cluster, bodies, delay_ms=600_000)
    await cluster.wait_applied()
    assert pending_everywhere(cluster) == [20, 20, 20]
    assert all(not delivered_on(cluster, n) for n in cluster.stores)
    cluster.clock.advance(590_000)  # real time passes too: leave it 10 s
    await asyncio.sleep(0.6)  # time enough for a deliverer to go wrong
    assert all(not delivered_on(cluster, n) for n in cluster.stores), "delivered before its time"
    cluster.clock.advance(10_000)
    await cluster.eventually(lambda: pending_everywhere(cluster) == [0, 0, 0], what="every timer done")
    await cluster.wait_applied()
    for node in cluster.stores:
        assert delivered_on(cluster, node) == Counter(bodies), node
    copy = cluster.stores[await cluster.wait_leader()].get_messages("T", 0, 0, 1).messages[0]
    assert mc.REAL_TOPIC not in copy.properties and mc.TIMER_ORIGIN_OFFSET in copy.properties


async def test_an_isolated_leaders_deliveries_are_not_repeated_by_the_next_leader(cluster: BrokerCluster):
    bodies = [b"f%d" % i for i in range(30)]
    await send_timed(cluster, bodies, delay_ms=1_000)
    await cluster.wait_applied()
    old = await cluster.wait_leader()
    term = cluster.servers[old].member_state.term
    cluster.network.isolate(old)
    cluster.clock.advance(1_000)  # the old leader tries to deliver; nothing it writes can commit
    new = await cluster.wait_leader(among=[n for n in cluster.servers if n != old], min_term=term + 1)
    await cluster.eventually(lambda: len(cluster.brokers[new].timers.state) == 0, what="the new leader delivered")
    cluster.network.heal()
    await cluster.eventually(lambda: pending_everywhere(cluster) == [0, 0, 0], what="every replica caught up")
    await cluster.wait_applied()
    for node in cluster.stores:
        assert delivered_on(cluster, node) == Counter(bodies), node


async def test_a_recalled_timer_is_never_delivered_even_by_a_new_leader(cluster: BrokerCluster):
    handles = await send_timed(cluster, [b"kept", b"recalled"], delay_ms=5_000)
    broker = await cluster.leader_broker()
    await cluster.wait_applied()
    recalled_id = await broker.timers.recall("T", handles[1])
    with pytest.raises(BrokerError) as again:
        await broker.timers.recall("T", handles[1])
    assert again.value.code == pb.NOT_FOUND
    await cluster.wait_applied()
    old = await cluster.wait_leader()
    term = cluster.servers[old].member_state.term
    await cluster.stop(old)
    await cluster.wait_leader(min_term=term + 1)
    cluster.clock.advance(5_000)
    await cluster.eventually(lambda: pending_everywhere(cluster) == [0, 0], what="the kept timer delivered")
    await cluster.wait_applied()
    for node in cluster.stores:
        assert delivered_on(cluster, node) == Counter([b"kept"]), node
    assert recalled_id.startswith("01")


async def test_a_level_message_is_due_its_levels_delay_after_it_was_sent(cluster: BrokerCluster):
    broker = await cluster.leader_broker()
    answer = await broker.sender.send([protocol_message("T", b"level2", user={"DELAY": "2"})])  # 5 s
    assert answer.status.code == pb.OK and answer.entries[0].recall_handle
    await cluster.wait_applied()
    [offset] = broker.timers.state.pending
    timer = broker.timers.state.get(offset)
    sent_at = timer.due_ms - 5_000
    assert cluster.clock() - 5_000 < sent_at <= cluster.clock()
    assert broker.timers.state.due(timer.due_ms - 1, 10) == [] and broker.timers.state.due(timer.due_ms, 10)
    cluster.clock.advance(5_000)
    await cluster.eventually(lambda: pending_everywhere(cluster) == [0, 0, 0], what="the level message delivered")
