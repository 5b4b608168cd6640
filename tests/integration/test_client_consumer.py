"""broker.client's SimpleConsumer, PullConsumer and transactions against three
real node processes: what is received is what was sent, acked messages are
not delivered again, batched acks, change invisible duration, tag filters,
FIFO order per message group, delayed messages on time, transaction commit,
rollback and check-back, and offset-based pulls."""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import datetime, timezone

import pytest

from broker.client import (AckError, AdminClient, BadRequestError, Message, OffsetPolicy, Producer, PullConsumer,
                           ReceivedMessage, SimpleConsumer, TransactionResolution)
from cluster.process_cluster import ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from tests.integration.broker_cluster import SPARSE_FILES, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The broker's shortest lease for a receive, and its shortest long poll.
MIN_INVISIBLE_S = 10
SHORT_POLL_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("consumer"), extra_args=SPARSE_FILES)
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def producer(cluster):
    async with Producer(servers(cluster)) as p:
        yield p


async def create_topic(cluster, topic: str, queues: int = 2, message_type: str = "normal") -> None:
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(topic, queues, message_type)


async def receive_all(consumer: SimpleConsumer, count: int, deadline_s: float = 30.0,
                      invisible_s: float = 30.0, ack: bool = True) -> list[ReceivedMessage]:
    """Receive (and ack) until `count` messages arrived or the deadline passed."""
    received: list[ReceivedMessage] = []
    deadline = time.monotonic() + deadline_s
    while len(received) < count and time.monotonic() < deadline:
        batch = await consumer.receive(32, invisible_s, await_duration_s=SHORT_POLL_S)
        if ack and batch:
            await consumer.ack(*batch)
        received += batch
    return received


async def test_received_messages_are_what_was_sent_and_acked_ones_do_not_come_back(cluster, producer):
    await create_topic(cluster, "Receive")
    sent = [await producer.send(Message("Receive", b"body-%d" % i, tag="TagA", keys=["key-%d" % i],
                                        properties={"color": "red"})) for i in range(20)]
    async with SimpleConsumer(servers(cluster), "ReceiveGroup", {"Receive": "*"}) as consumer:
        received = await receive_all(consumer, 20)
        assert sorted(m.message_id for m in received) == sorted(r.message_id for r in sent)
        by_id = {m.message_id: m for m in received}
        for i, receipt in enumerate(sent):
            message = by_id[receipt.message_id]
            assert (message.body, message.tag, message.keys, message.properties) == \
                (b"body-%d" % i, "TagA", ["key-%d" % i], {"color": "red"})
            assert (message.queue_id, message.queue_offset) == (receipt.queue_id, receipt.offset)
            assert message.delivery_attempt == 1 and not message.corrupted and message.receipt_handle
        assert await consumer.receive(32, MIN_INVISIBLE_S, await_duration_s=SHORT_POLL_S) == []


async def test_one_ack_call_acknowledges_hundreds_of_messages(cluster, producer):
    await create_topic(cluster, "BatchAck", queues=1)
    await producer.send_batch([Message("BatchAck", b"%d" % i) for i in range(300)])
    async with SimpleConsumer(servers(cluster), "BatchAckGroup", ["BatchAck"]) as consumer:
        received = await receive_all(consumer, 300, ack=False)
        assert len(received) == 300
        await consumer.ack(*received)
    # Every message acknowledged: the group's consumed offset reaches the end.
    async with AdminClient(servers(cluster)) as admin:
        deadline = time.monotonic() + 15
        while (lag := (await admin.describe_lag("BatchAckGroup", "BatchAck"))[0]).lag and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    assert (lag.committed_offset, lag.lag) == (300, 0)


async def test_an_ack_with_a_stale_receipt_handle_names_the_message(cluster, producer):
    await create_topic(cluster, "StaleAck", queues=1)
    await producer.send(Message("StaleAck", b"x"))
    async with SimpleConsumer(servers(cluster), "StaleAckGroup", ["StaleAck"]) as consumer:
        [message] = await receive_all(consumer, 1, ack=False)
        good_handle = message.receipt_handle
        message.receipt_handle = "not-a-receipt-handle"
        with pytest.raises(AckError) as raised:
            await consumer.ack(message)
        assert set(raised.value.failures) == {message.message_id}
        assert raised.value.failures[message.message_id].code == pb.INVALID_RECEIPT_HANDLE
        message.receipt_handle = good_handle
        await consumer.ack(message)


async def test_one_bad_handle_in_an_ack_fails_only_its_message_and_the_rest_stay_acked(cluster, producer):
    await create_topic(cluster, "MixedAck", queues=1)
    for i in range(3):
        await producer.send(Message("MixedAck", b"m%d" % i))
    async with SimpleConsumer(servers(cluster), "MixedAckGroup", ["MixedAck"]) as consumer:
        messages = await receive_all(consumer, 3, ack=False)
        assert len(messages) == 3
        bad = messages[1]
        good_handle, bad.receipt_handle = bad.receipt_handle, "not-a-receipt-handle"
        with pytest.raises(AckError) as raised:
            await consumer.ack(*messages)
        assert set(raised.value.failures) == {bad.message_id}
        bad.receipt_handle = good_handle
        await consumer.ack(bad)
    # All three acknowledged, long before their 30 s leases could run out:
    # the mixed call did ack the other two.
    async with AdminClient(servers(cluster)) as admin:
        deadline = time.monotonic() + 5
        while (lag := (await admin.describe_lag("MixedAckGroup", "MixedAck"))[0]).lag and \
                time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    assert (lag.committed_offset, lag.lag) == (3, 0)


async def test_a_message_whose_lease_is_cut_to_zero_comes_back_with_the_attempt_raised(cluster, producer):
    await create_topic(cluster, "Lease", queues=1)
    receipt = await producer.send(Message("Lease", b"again"))
    async with SimpleConsumer(servers(cluster), "LeaseGroup", ["Lease"]) as consumer:
        [first] = await receive_all(consumer, 1, ack=False)
        old_handle = first.receipt_handle
        changed = await consumer.change_invisible_duration(first, 0)
        assert changed.receipt_handle and changed.receipt_handle != old_handle
        [again] = await receive_all(consumer, 1, ack=False)
        assert (again.message_id, again.delivery_attempt) == (receipt.message_id, 2)
        await consumer.ack(again)


async def test_an_extended_lease_keeps_the_message_away_past_its_first_duration(cluster, producer):
    await create_topic(cluster, "Extend", queues=1)
    await producer.send(Message("Extend", b"slow work"))
    async with SimpleConsumer(servers(cluster), "ExtendGroup", ["Extend"]) as consumer:
        [message] = await consumer.receive(1, MIN_INVISIBLE_S, await_duration_s=SHORT_POLL_S)
        received_at = time.monotonic()
        await consumer.change_invisible_duration(message, 60)
        # Past the first lease, nothing comes back: the extension holds.
        while time.monotonic() - received_at < MIN_INVISIBLE_S + 1:
            assert await consumer.receive(1, MIN_INVISIBLE_S, await_duration_s=SHORT_POLL_S) == []
        await consumer.ack(message)  # the new handle acks


async def test_a_tag_filter_receives_only_the_tags_it_names(cluster, producer):
    await create_topic(cluster, "Tags", queues=1)
    for tag in ("TagA", "TagB", "TagC", "TagA"):
        await producer.send(Message("Tags", tag.encode(), tag=tag))
    async with SimpleConsumer(servers(cluster), "TagsGroup", {"Tags": "TagA || TagC"}) as consumer:
        # One queue: the first receive returns every message the filter lets through.
        received = await consumer.receive(32, 30, await_duration_s=SHORT_POLL_S)
        assert sorted(m.tag for m in received) == ["TagA", "TagA", "TagC"]


async def test_fifo_messages_of_a_group_are_received_in_send_order(cluster, producer):
    await create_topic(cluster, "FifoReceive", queues=2, message_type="fifo")
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_group("FifoGroup", fifo=True)
    groups = ["a", "b", "c"]
    await asyncio.gather(*(producer.send_async(Message("FifoReceive", f"{g}:{i}".encode(), message_group=g))
                           for i in range(10) for g in groups))
    async with SimpleConsumer(servers(cluster), "FifoGroup", ["FifoReceive"]) as consumer:
        received = await receive_all(consumer, 30)
    order: dict[str, list[int]] = defaultdict(list)
    for message in received:
        group, sequence = message.body.decode().split(":")
        assert message.message_group == group and message.message_type == "FIFO"
        order[group].append(int(sequence))
    assert order == {g: list(range(10)) for g in groups}


async def test_a_delayed_message_arrives_on_time_and_not_before(cluster, producer):
    await create_topic(cluster, "Delayed", queues=1, message_type="delay")
    receipt = await producer.send(Message("Delayed", b"later", delay=3))
    sent_at = time.time()
    async with SimpleConsumer(servers(cluster), "DelayedGroup", ["Delayed"]) as consumer:
        [message] = await receive_all(consumer, 1)
        arrived_at = time.time()
    assert message.message_id == receipt.message_id and message.message_type == "DELAY"
    assert message.delivery_timestamp is not None
    due = message.delivery_timestamp.timestamp()
    assert due == pytest.approx(sent_at + 3, abs=0.5)
    assert due - 0.1 <= arrived_at <= due + 1.5, f"arrived {arrived_at - due:+.2f} s from due"
    assert receipt.recall_handle


async def test_a_committed_transaction_is_received_and_a_rolled_back_one_never(cluster, producer):
    await create_topic(cluster, "Txn", queues=1, message_type="transaction")
    async with producer.begin_transaction() as transaction:
        committed = await transaction.send(Message("Txn", b"commit me"))
        assert committed.transaction_id
    rolled_back = producer.begin_transaction()
    await rolled_back.send(Message("Txn", b"roll me back"))
    await rolled_back.rollback()
    with pytest.raises(ZeroDivisionError):
        async with producer.begin_transaction() as failed:
            await failed.send(Message("Txn", b"fails locally"))
            raise ZeroDivisionError
    assert failed.resolution == TransactionResolution.ROLLBACK
    async with SimpleConsumer(servers(cluster), "TxnGroup", ["Txn"]) as consumer:
        # One queue, every transaction decided: one receive returns all that is visible.
        received = await consumer.receive(32, 30, await_duration_s=SHORT_POLL_S)
        assert [m.body for m in received] == [b"commit me"]


async def test_an_undecided_transaction_is_checked_back_and_the_checkers_verdict_holds(cluster):
    await create_topic(cluster, "TxnCheck", queues=1, message_type="transaction")
    asked: list[ReceivedMessage] = []

    def checker(message: ReceivedMessage) -> TransactionResolution:
        asked.append(message)
        return TransactionResolution.COMMIT if message.body == b"keep" else TransactionResolution.ROLLBACK

    async with Producer(servers(cluster), ["TxnCheck"], checker=checker, transaction_recovery_s=1) as producer:
        for body in (b"keep", b"drop"):
            await producer.begin_transaction().send(Message("TxnCheck", body))  # and never decided
        deadline = time.monotonic() + 30
        while len(asked) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert sorted(m.body for m in asked) == [b"drop", b"keep"]
        assert all(m.transaction_id and m.topic == "TxnCheck" for m in asked)
        async with SimpleConsumer(servers(cluster), "TxnCheckGroup", ["TxnCheck"]) as consumer:
            received = await receive_all(consumer, 1)
            assert [m.body for m in received] == [b"keep"]


async def test_a_pull_consumer_reads_by_offset_and_commits_where_it_stands(cluster, producer):
    await create_topic(cluster, "Pull", queues=1)
    receipts = await producer.send_batch([Message("Pull", b"%d" % i) for i in range(50)])
    async with PullConsumer(servers(cluster), "PullGroup") as puller:
        assert await puller.queue_ids("Pull") == [0]
        assert await puller.committed("Pull", 0) is None
        begin = await puller.query_offset("Pull", 0, OffsetPolicy.BEGINNING)
        end = await puller.query_offset("Pull", 0, OffsetPolicy.END)
        assert (begin, end) == (0, 50)
        first = await puller.pull("Pull", 0, 10, max_messages=20)
        assert [m.body for m in first.messages] == [b"%d" % i for i in range(10, 30)]
        assert [m.queue_offset for m in first.messages] == list(range(10, 30)) and first.next_offset == 30
        assert first.messages[0].message_id == receipts[10].message_id
        await puller.commit("Pull", 0, first.next_offset)
        assert await puller.committed("Pull", 0) == 30
        rest = await puller.pull("Pull", 0, first.next_offset, max_messages=32)
        assert [m.body for m in rest.messages] == [b"%d" % i for i in range(30, 50)] and rest.next_offset == 50
        assert (await puller.pull("Pull", 0, 50)).messages == []
    async with AdminClient(servers(cluster)) as admin:
        [lag] = await admin.describe_lag("PullGroup", "Pull")
    assert (lag.committed_offset, lag.lag) == (30, 20)


async def test_a_pull_from_a_timestamp_starts_at_the_first_message_stored_after_it(cluster, producer):
    await create_topic(cluster, "PullTime", queues=1)
    await producer.send_batch([Message("PullTime", b"old-%d" % i) for i in range(5)])
    await asyncio.sleep(1.1)
    middle = datetime.now(timezone.utc)
    await producer.send_batch([Message("PullTime", b"new-%d" % i) for i in range(5)])
    async with PullConsumer(servers(cluster), "PullTimeGroup") as puller:
        offset = await puller.query_offset("PullTime", 0, OffsetPolicy.TIMESTAMP, middle)
        assert offset == 5
        assert [m.body for m in (await puller.pull("PullTime", 0, offset)).messages] == \
            [b"new-%d" % i for i in range(5)]


async def test_receiving_without_a_subscription_is_a_bad_request(cluster):
    async with SimpleConsumer(servers(cluster), "NoTopics") as consumer:
        with pytest.raises(BadRequestError):
            await consumer.receive()
