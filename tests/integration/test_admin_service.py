"""The admin service (pydledger.admin.v1) on three real node processes started
with `--auto-create-topic false`: topics and groups are created, changed,
listed and deleted through any node (followers forward to the leader), lag
is the committed offset against the queue end, and every bad input is refused
with the protocol's code and a readable message."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from broker.client import AdminClient, BadRequestError, Message, NotFoundError, Producer, PullConsumer
from cluster.process_cluster import ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("admin"), extra_args=["--auto-create-topic", "false", *SPARSE_FILES])
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def admin(cluster):
    async with AdminClient(servers(cluster)) as client:
        yield client


async def test_a_topic_created_through_a_follower_is_listed_by_every_node(cluster, admin):
    leader = await leader_of(cluster)
    follower = next(a for n, a in cluster.addresses.items() if n != leader)
    async with grpc.aio.insecure_channel(follower) as channel:
        # A leader is elected before the last node listens (make test: refused).
        await asyncio.wait_for(channel.channel_ready(), 15)
        answer = await admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
            apb.CreateTopicRequest(topic="Created", queue_count=3, message_type=apb.FIFO), timeout=10)
    assert answer.status.code == pb.OK and answer.created
    assert answer.topic.write_queue_count == 3 and answer.topic.message_type == apb.FIFO
    for address in cluster.addresses.values():
        async with AdminClient(address) as client:
            topics = {t.topic: t for t in await client.list_topics()}
        assert topics["Created"].queues == 3 and topics["Created"].message_type == "fifo"


async def test_creating_the_same_topic_twice_is_no_error_but_a_different_one_is(admin):
    first, created = await admin.create_topic("Twice", 2, "normal")
    again, created_again = await admin.create_topic("Twice", 2, "normal")
    assert (created, created_again) == (True, False) and again == first
    with pytest.raises(BadRequestError) as raised:
        await admin.create_topic("Twice", 4, "normal")
    assert raised.value.code == pb.BAD_REQUEST and "use update" in raised.value.message


async def test_an_update_adds_queues_and_changes_type_and_permission(admin):
    await admin.create_topic("Grows", 2, "normal")
    grown = await admin.update_topic("Grows", queues=6, message_type="delay", permission="read")
    assert (grown.queues, grown.message_type, grown.permission) == (6, "delay", "read")
    assert [q.queue_id for q in grown.offsets] == list(range(6))


async def test_a_deleted_topic_is_gone_and_sends_to_it_fail_with_auto_creation_off(cluster, admin):
    await admin.create_topic("Doomed", 1)
    async with Producer(servers(cluster)) as producer:
        await producer.send(Message("Doomed", b"x"))
        await admin.delete_topic("Doomed")
        assert "Doomed" not in {t.topic for t in await admin.list_topics()}
        with pytest.raises(NotFoundError) as raised:
            await producer.send(Message("Doomed", b"y"))
    assert raised.value.code == pb.TOPIC_NOT_FOUND


async def test_internal_topics_are_listed_only_when_asked(cluster, admin):
    await admin.create_topic("Later", 1, "delay")
    async with Producer(servers(cluster)) as producer:
        await producer.send(Message("Later", b"x", delay=600))
    shown = {t.topic for t in await admin.list_topics()}
    internal = {t.topic for t in await admin.list_topics(include_system=True) if t.system}
    assert internal and "Later" in shown and not internal & shown


async def test_groups_are_created_updated_and_listed(admin):
    group, created = await admin.create_group("Billing", max_retries=3, fifo=True)
    assert created and (group.max_retries, group.fifo) == (3, True)
    updated = await admin.update_group("Billing", max_retries=5)
    assert (updated.max_retries, updated.fifo) == (5, True)
    default, _ = await admin.create_group("Defaults")
    assert (default.max_retries, default.fifo) == (16, False)
    listed = {g.group: g for g in await admin.list_groups()}
    assert listed["Billing"].max_retries == 5 and "Defaults" in listed


async def test_lag_is_the_committed_offset_against_the_queue_end(cluster, admin):
    await admin.create_topic("Lagging", 2)
    await admin.create_group("Laggard")
    async with Producer(servers(cluster)) as producer:
        receipts = await producer.send_batch([Message("Lagging", b"%d" % i) for i in range(10)])
    ends = {q: sum(1 for r in receipts if r.queue_id == q) for q in (0, 1)}
    lags = {q.queue_id: q for q in await admin.describe_lag("Laggard", "Lagging")}
    assert {q: lags[q].lag for q in (0, 1)} == ends
    assert all(lags[q].committed_offset == -1 and lags[q].max_offset == ends[q] for q in (0, 1))
    async with PullConsumer(servers(cluster), "Laggard") as puller:
        await puller.commit("Lagging", 0, 1)
    lags = {q.queue_id: q for q in await admin.describe_lag("Laggard")}
    assert (lags[0].committed_offset, lags[0].lag) == (1, ends[0] - 1)


# ---------------------------------------------------------------- bad input

BAD_TOPIC_CREATES = [
    pytest.param(apb.CreateTopicRequest(topic="bad topic!"), pb.ILLEGAL_TOPIC, id="illegal-name"),
    pytest.param(apb.CreateTopicRequest(topic=""), pb.ILLEGAL_TOPIC, id="blank-name"),
    pytest.param(apb.CreateTopicRequest(topic="T" * 128), pb.ILLEGAL_TOPIC, id="name-too-long"),
    pytest.param(apb.CreateTopicRequest(topic="TBW102"), pb.ILLEGAL_TOPIC, id="system-topic"),
    pytest.param(apb.CreateTopicRequest(topic="%DLQ%g"), pb.ILLEGAL_TOPIC, id="dead-letter-topic"),
    pytest.param(apb.CreateTopicRequest(topic="Q", queue_count=-1), pb.BAD_REQUEST, id="negative-queues"),
    pytest.param(apb.CreateTopicRequest(topic="Q", queue_count=5000), pb.BAD_REQUEST, id="too-many-queues"),
    pytest.param(apb.CreateTopicRequest(topic="Q", message_type=42), pb.BAD_REQUEST, id="unknown-type"),
    pytest.param(apb.CreateTopicRequest(topic="Q", permission=42), pb.BAD_REQUEST, id="unknown-permission"),
]


@pytest.mark.parametrize("request_, code", BAD_TOPIC_CREATES)
async def test_a_bad_topic_create_is_refused_with_its_code(cluster, request_, code):
    async with grpc.aio.insecure_channel(next(iter(cluster.addresses.values()))) as channel:
        answer = await admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(request_, timeout=10)
    assert answer.status.code == code, answer.status.message
    assert answer.status.message and not answer.created


async def test_removing_queues_is_refused(admin):
    await admin.create_topic("Shrinks", 4)
    with pytest.raises(BadRequestError) as raised:
        await admin.update_topic("Shrinks", queues=2)
    assert raised.value.code == pb.BAD_REQUEST and "cannot be removed" in raised.value.message


async def test_updating_a_missing_topic_is_topic_not_found(admin):
    with pytest.raises(NotFoundError) as raised:
        await admin.update_topic("NoSuchTopic", queues=9)
    assert raised.value.code == pb.TOPIC_NOT_FOUND


async def test_deleting_a_missing_topic_is_topic_not_found(admin):
    with pytest.raises(NotFoundError) as raised:
        await admin.delete_topic("NeverThere")
    assert raised.value.code == pb.TOPIC_NOT_FOUND


async def test_an_illegal_group_name_is_refused(admin):
    with pytest.raises(BadRequestError) as raised:
        await admin.create_group("bad group!")
    assert raised.value.code == pb.ILLEGAL_CONSUMER_GROUP


async def test_a_system_group_is_refused(admin):
    with pytest.raises(BadRequestError) as raised:
        await admin.create_group("CID_RMQ_SYS_X")
    assert raised.value.code == pb.ILLEGAL_CONSUMER_GROUP


async def test_negative_max_retries_are_refused(admin):
    with pytest.raises(BadRequestError) as raised:
        await admin.create_group("Negative", max_retries=-1)
    assert raised.value.code == pb.BAD_REQUEST and "max retries" in raised.value.message


async def test_a_conflicting_group_create_is_refused(admin):
    await admin.create_group("Conflict", max_retries=2)
    with pytest.raises(BadRequestError) as raised:
        await admin.create_group("Conflict", max_retries=7)
    assert raised.value.code == pb.BAD_REQUEST and "use update" in raised.value.message


async def test_updating_a_missing_group_is_consumer_group_not_found(admin):
    with pytest.raises(NotFoundError) as raised:
        await admin.update_group("NoSuchGroup", max_retries=1)
    assert raised.value.code == pb.CONSUMER_GROUP_NOT_FOUND


async def test_lag_of_a_missing_group_is_consumer_group_not_found(admin):
    with pytest.raises(NotFoundError) as raised:
        await admin.describe_lag("NoSuchGroup")
    assert raised.value.code == pb.CONSUMER_GROUP_NOT_FOUND


async def test_lag_on_a_missing_topic_is_topic_not_found(admin):
    await admin.create_group("Watcher")
    with pytest.raises(NotFoundError) as raised:
        await admin.describe_lag("Watcher", "NoSuchTopic")
    assert raised.value.code == pb.TOPIC_NOT_FOUND
