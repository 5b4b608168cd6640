"""Delayed and timed messages on three real node processes: visible in their
topic within 1 s of their due time and never before (timestamps and delay
levels), recall, bad input, a retried send stored once, and timers that
survive a SIGKILLed leader and a whole-cluster restart, each delivered once.

What consumers see is read from the leader's ConsumeQueue files (read-only,
tests/integration/broker_helpers.py)."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store import codec
from store import message_const as mc
from store.errors import MessageDecodeError
from tests.integration.broker_helpers import (METADATA, QueueReader, Watcher, leader_of, message, retrying, send,
                                              stubs_of)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
QUEUES = 8  # auto-created topics


def at(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("timers"))
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def stubs(cluster):
    leader = await leader_of(cluster)
    channels, by_node = stubs_of(cluster.addresses)
    yield leader, by_node
    for channel in channels.values():
        await channel.close()


def reader(cluster: ProcessCluster, node: str) -> QueueReader:
    return QueueReader(cluster.base / node, node)


async def test_timed_and_level_messages_become_visible_within_a_second_of_due_and_never_before(cluster, stubs):
    leader, by_node = stubs
    stub = by_node[leader]
    sent_at = now_ms()
    timed = [message("Timed", b"in %d ms" % d, delivery_timestamp=at(sent_at + d), message_type=pb.DELAY)
             for d in (1_000, 1_500, 2_500, 4_000)]
    levels = [message("Timed", b"level %d" % level, user={"DELAY": str(level)}) for level in (1, 2)]
    due: dict[str, int] = {}
    for m in timed:
        answer = await send(stub, m)
        assert answer.status.code == pb.OK and answer.entries[0].recall_handle, answer
        due[m.system_properties.message_id] = m.system_properties.delivery_timestamp.ToMilliseconds()
    for m, level_ms in zip(levels, (1_000, 5_000)):
        before = now_ms()
        answer = await send(stub, m)
        assert answer.status.code == pb.OK, answer
        due[m.system_properties.message_id] = before + level_ms  # at the earliest: sent after `before`
    watcher = Watcher(reader(cluster, leader), "Timed", QUEUES)
    watcher.poll()
    assert not watcher.seen, "visible before its time"
    await watcher.until(set(due), timeout=15)
    lateness = {}
    for message_id, due_ms in due.items():
        seen_ms, stored = watcher.seen[message_id]
        stored_due = int(stored.properties[mc.TIMER_DELIVER_MS])
        assert stored.store_timestamp >= stored_due, "made visible before its due time"
        assert stored_due >= due_ms - 50, "a level message due earlier than its level's delay after sending"
        lateness[message_id] = seen_ms - stored_due
    print(json.dumps({"delay_lateness_ms": sorted(lateness.values()),
                      "stored_after_due_ms": sorted(s.store_timestamp - int(s.properties[mc.TIMER_DELIVER_MS])
                                                    for _, s in watcher.seen.values())}))
    assert max(lateness.values()) < 1_000, lateness
    watcher.poll()
    assert set(watcher.copies.values()) == {1}, "a timer delivered twice"
    # The consumer-facing copy is a DELAY message of its own topic.
    copy = watcher.seen[timed[0].system_properties.message_id][1]
    assert copy.topic == "Timed" and mc.REAL_TOPIC not in copy.properties and copy.body == b"in 1000 ms"


async def test_the_timer_topics_are_closed_to_clients(stubs):
    leader, by_node = stubs
    for topic in ("SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"):
        route = await by_node[leader].QueryRoute(spb.QueryRouteRequest(
            topic=pb.Resource(name=topic),
            endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)])),
            metadata=METADATA, timeout=10)
        assert route.status.code == pb.ILLEGAL_TOPIC


async def test_a_recalled_message_is_never_delivered_and_recall_answers_what_happened(cluster, stubs):
    leader, by_node = stubs
    follower = next(n for n in by_node if n != leader)
    kept = message("Recall", b"kept", delivery_timestamp=at(now_ms() + 1_500), message_type=pb.DELAY)
    recalled = message("Recall", b"recalled", delivery_timestamp=at(now_ms() + 1_500), message_type=pb.DELAY)
    handles = [(await send(by_node[leader], m)).entries[0].recall_handle for m in (kept, recalled)]

    async def recall(topic: str, handle: str, node: str = leader) -> spb.RecallMessageResponse:
        request = spb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
        return await retrying(lambda: by_node[node].RecallMessage(request, metadata=METADATA, timeout=10))

    answer = await recall("Recall", handles[1], node=follower)  # forwarded to the leader
    assert answer.status.code == pb.OK, answer.status
    assert answer.message_id == recalled.system_properties.message_id
    assert (await recall("Recall", handles[1])).status.code == pb.NOT_FOUND  # already recalled
    assert (await recall("Other", handles[0])).status.code == pb.BAD_REQUEST
    assert (await recall("Recall", "bm90IGEgaGFuZGxl")).status.code == pb.BAD_REQUEST
    assert (await recall("Recall", "")).status.code == pb.BAD_REQUEST
    assert (await recall("bad topic!", handles[0])).status.code == pb.ILLEGAL_TOPIC
    watcher = Watcher(reader(cluster, leader), "Recall", QUEUES)
    await watcher.until({kept.system_properties.message_id}, timeout=10)
    await asyncio.sleep(0.5)
    watcher.poll()
    assert recalled.system_properties.message_id not in watcher.seen
    assert (await recall("Recall", handles[0])).status.code == pb.NOT_FOUND  # delivered already


async def test_a_retried_delayed_send_is_stored_once_with_the_same_recall_handle(cluster, stubs):
    leader, by_node = stubs
    follower = next(n for n in by_node if n != leader)
    m = message("Retried", b"once", delivery_timestamp=at(now_ms() + 800), message_type=pb.DELAY)
    first = await send(by_node[leader], m)
    again = await send(by_node[follower], m)
    assert first.entries[0].recall_handle == again.entries[0].recall_handle != ""
    watcher = Watcher(reader(cluster, leader), "Retried", QUEUES)
    await watcher.until({m.system_properties.message_id}, timeout=10)
    await asyncio.sleep(0.3)
    watcher.poll()
    assert watcher.copies == {m.system_properties.message_id: 1}


async def test_a_delivery_time_already_past_is_visible_at_once(cluster, stubs):
    leader, by_node = stubs
    m = message("Past", b"late", delivery_timestamp=at(now_ms() - 5_000), message_type=pb.DELAY)
    answer = await send(by_node[leader], m)
    assert answer.status.code == pb.OK and answer.entries[0].recall_handle == ""
    watcher = Watcher(reader(cluster, leader), "Past", QUEUES)
    await watcher.until({m.system_properties.message_id}, timeout=2)


@pytest.mark.parametrize("bad, code", [
    (lambda: message("T", delivery_timestamp=at(now_ms() + 25 * 3600 * 1000), message_type=pb.DELAY),
     pb.ILLEGAL_DELIVERY_TIME),
    (lambda: message("T", user={"DELAY": "soon"}), pb.ILLEGAL_DELIVERY_TIME),
    (lambda: message("T", user={"DELAY": "0"}), pb.ILLEGAL_DELIVERY_TIME),
    (lambda: message("T", user={"DELAY": "2"}, delivery_timestamp=at(now_ms() + 1000), message_type=pb.DELAY),
     pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("T", user={"DELAY": "2"}, message_type=pb.TRANSACTION), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("T", user={"DELAY": "2"}, message_group="g"), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("T", delivery_timestamp=at(now_ms() + 1000), message_type=pb.TRANSACTION),
     pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("T", delivery_timestamp=at(now_ms() + 1000), message_type=pb.NORMAL),
     pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("T", user={"TIMER_ORIGIN_OFFSET": "1"}), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (lambda: message("SCHEDULE_TOPIC_XXXX"), pb.ILLEGAL_TOPIC),
    (lambda: message("rmq_sys_wheel_timer"), pb.ILLEGAL_TOPIC),
])
async def test_bad_delayed_sends_get_the_protocols_codes(stubs, bad, code):
    leader, by_node = stubs
    answer = await send(by_node[leader], bad())
    assert answer.status.code == code, answer.status.message
    assert answer.status.message


async def test_a_level_above_the_last_is_the_last(stubs, cluster):
    leader, by_node = stubs
    answer = await send(by_node[leader], message("Clamped", user={"DELAY": "99"}))
    assert answer.status.code == pb.OK
    client = DLedgerClient(list(cluster.addresses.values()))
    try:
        stored = [m for m in await committed_messages(client) if m.topic == "SCHEDULE_TOPIC_XXXX"
                  and m.properties.get(mc.REAL_TOPIC) == "Clamped"]
    finally:
        await client.close()
    assert stored and stored[0].queue_id == 17 and stored[0].properties[mc.DELAY_TIME_LEVEL] == "18"
    answer = await by_node[leader].RecallMessage(spb.RecallMessageRequest(
        topic=pb.Resource(name="Clamped"), recall_handle=answer.entries[0].recall_handle),
        metadata=METADATA, timeout=10)
    assert answer.status.code == pb.OK  # no 2 h timer left behind in the module's cluster


async def committed_messages(client: DLedgerClient) -> list[codec.MessageExt]:
    found = []
    async for entry in client.read():
        try:
            found.append(codec.decode(entry.body))
        except MessageDecodeError:
            continue  # a system entry
    return found


def delivered_counts(messages: list[codec.MessageExt], topic: str) -> Counter[str]:
    return Counter(m.uniq_key for m in messages if m.topic == topic)


async def test_timers_survive_a_sigkilled_leader_and_a_full_restart_each_delivered_once(tmp_path):
    cluster = ProcessCluster(tmp_path)
    cluster.start()
    try:
        leader = await leader_of(cluster)
        channels, by_node = stubs_of(cluster.addresses)
        sent_at = now_ms()
        # Due from 1 s to 4 s: the leader is killed while it is delivering them.
        early = [message("Survive", b"%d" % i, delivery_timestamp=at(sent_at + 1_000 + 100 * i),
                         message_type=pb.DELAY) for i in range(30)]
        # Due after the whole cluster has been stopped and started again.
        late = [message("Survive", b"late %d" % i, delivery_timestamp=at(sent_at + 9_000 + 100 * i),
                        message_type=pb.DELAY) for i in range(5)]
        for batch in (early[:15], early[15:], late):
            assert (await send(by_node[leader], *batch)).status.code == pb.OK
        await asyncio.sleep(max(0.0, (sent_at + 2_500 - now_ms()) / 1000))
        cluster.kill(leader)
        survivors = [n for n in cluster.ids if n != leader]
        await asyncio.sleep(3.5)  # a new leader delivers the rest
        cluster.start(leader)
        await asyncio.sleep(1.0)
        assert now_ms() < sent_at + 8_500, "the machine is too slow for this test's schedule"
        cluster.stop_all()  # SIGTERM: the late timers are still pending
        cluster.start()
        new_leader = await leader_of(cluster)
        for channel in channels.values():
            await channel.close()
        channels, by_node = stubs_of(cluster.addresses)
        ids = {m.system_properties.message_id for m in early + late}
        watcher = Watcher(reader(cluster, new_leader), "Survive", QUEUES)
        await watcher.until(ids, timeout=max(5.0, (sent_at + 12_000 - now_ms()) / 1000))
        await asyncio.sleep(0.5)
        client = DLedgerClient(list(cluster.addresses.values()))
        try:
            await retrying(lambda: send(by_node[new_leader], message("Survive-marker")))
            logs = {node: [m async for m in _messages_of(client, node)] for node in cluster.ids}
        finally:
            await client.close()
        for node, messages in logs.items():
            count = delivered_counts(messages, "Survive")
            assert set(count) == ids and set(count.values()) == {1}, (node, survivors, count.most_common(3))
        early_ids = {m.system_properties.message_id for m in early}
        deliverers = {str(m.store_host) for m in logs[new_leader] if m.topic == "Survive" and m.uniq_key in early_ids}
        assert len(deliverers) >= 2, f"the leader was not killed while delivering: all by {deliverers}"
        late_copies = [m for m in logs[new_leader] if m.topic == "Survive" and m.uniq_key not in early_ids]
        print(json.dumps({"failover_lateness_ms": max(m.store_timestamp - int(m.properties[mc.TIMER_DELIVER_MS])
                                                      for m in logs[new_leader] if m.uniq_key in early_ids),
                          "after_restart_lateness_ms": max(m.store_timestamp - int(m.properties[mc.TIMER_DELIVER_MS])
                                                           for m in late_copies if mc.TIMER_DELIVER_MS in m.properties)}))
        for channel in channels.values():
            await channel.close()
    finally:
        cluster.stop_all()


async def _messages_of(client: DLedgerClient, node: str):
    async for entry in client.read(from_id=node):
        try:
            yield codec.decode(entry.body)
        except MessageDecodeError:
            continue
