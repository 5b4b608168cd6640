"""broker.client's Producer against three real node processes: receipts name
where a message is stored, concurrent sends share calls without losing their
own receipts, batches and message groups keep their order, retries are
answered with the original receipt, and refusals arrive as typed errors with
the protocol's codes."""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from broker.client import (AdminClient, BadRequestError, Message, PayloadTooLargeError, PreconditionFailedError,
                           Producer, UnavailableError)
from cluster.process_cluster import ProcessCluster, free_ports
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers, stored_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("producer"), extra_args=SPARSE_FILES)
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def producer(cluster):
    async with Producer(servers(cluster)) as p:
        yield p


async def create_topic(cluster, topic: str, queues: int = 4, message_type: str = "normal") -> None:
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(topic, queues, message_type)


async def test_a_receipt_names_the_queue_and_offset_the_message_is_stored_at(cluster, producer):
    await create_topic(cluster, "ReceiptTopic")
    receipts = [await producer.send(Message("ReceiptTopic", b"m%d" % i, tag="TagA", keys=["k%d" % i]))
                for i in range(6)]
    stored = {m.message_id: m for m in await stored_messages(cluster, "ReceiptTopic")}
    for i, receipt in enumerate(receipts):
        message = stored[receipt.message_id]
        assert (message.queue_id, message.queue_offset, message.body) == (receipt.queue_id, receipt.offset, b"m%d" % i)
        assert message.properties["TAGS"] == "TagA" and message.properties["KEYS"] == "k%d" % i
    assert len({r.queue_id for r in receipts}) > 1  # the broker spreads sends over the queues


async def test_concurrent_sends_each_get_their_own_receipt_and_offsets_stay_dense(cluster, producer):
    await create_topic(cluster, "ConcurrentTopic")
    futures = [producer.send_async(Message("ConcurrentTopic", b"%d" % i)) for i in range(500)]
    receipts = await asyncio.gather(*futures)
    assert len({r.message_id for r in receipts}) == 500
    by_queue: dict[int, list[int]] = defaultdict(list)
    for receipt in receipts:
        by_queue[receipt.queue_id].append(receipt.offset)
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))
    stored = await stored_messages(cluster, "ConcurrentTopic")
    assert sorted(m.message_id for m in stored) == sorted(r.message_id for r in receipts)


async def test_a_batch_is_stored_in_order(cluster, producer):
    await create_topic(cluster, "BatchTopic", queues=1)
    receipts = await producer.send_batch([Message("BatchTopic", b"%d" % i) for i in range(300)])
    assert [r.offset for r in receipts] == list(range(300))
    assert [m.body for m in await stored_messages(cluster, "BatchTopic")] == [b"%d" % i for i in range(300)]


async def test_messages_of_one_group_stay_in_one_queue_in_send_order(cluster, producer):
    await create_topic(cluster, "FifoTopic", queues=4, message_type="fifo")
    groups = [f"order-{g}" for g in range(6)]
    # Interleaved and all in flight at once: batching must not reorder a group.
    futures = [producer.send_async(Message("FifoTopic", f"{g}:{i}".encode(), message_group=g))
               for i in range(40) for g in groups]
    await asyncio.gather(*futures)
    by_group: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for message in await stored_messages(cluster, "FifoTopic"):
        group, sequence = message.body.decode().split(":")
        by_group[group].append((message.queue_id, message.queue_offset, int(sequence)))
    for group in groups:
        stored = by_group[group]
        assert len({queue for queue, _, _ in stored}) == 1, f"{group} spread over queues"
        assert [seq for _, _, seq in sorted(stored)] == list(range(40)), f"{group} out of order"


async def test_a_repeated_send_is_answered_with_the_original_receipt(cluster, producer):
    await create_topic(cluster, "RepeatTopic")
    pending = producer._pending(Message("RepeatTopic", b"once"))
    first = (await producer.send_call("RepeatTopic", [pending.message]))[0]
    again = (await producer.send_call("RepeatTopic", [pending.message]))[0]
    assert again == first
    assert [m.body for m in await stored_messages(cluster, "RepeatTopic")] == [b"once"]


async def test_a_client_given_only_a_follower_finds_the_leader(cluster):
    leader = await leader_of(cluster)
    follower = next(a for n, a in cluster.addresses.items() if n != leader)
    async with Producer(follower) as producer:
        receipt = await producer.send(Message("FollowerTopic", b"via follower"))
        assert producer.connection.known_leader == cluster.addresses[leader]
    assert receipt.message_id in {m.message_id for m in await stored_messages(cluster, "FollowerTopic")}


async def test_refusals_are_typed_errors_carrying_the_protocols_code(cluster, producer):
    await create_topic(cluster, "FifoOnly", queues=2, message_type="fifo")
    cases = [
        (Message("bad topic!", b"x"), BadRequestError, pb.ILLEGAL_TOPIC),
        (Message("FifoOnly", b"not fifo"), BadRequestError, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (Message("T", b"x", tag="a||b"), BadRequestError, pb.ILLEGAL_MESSAGE_TAG),
        (Message("T", b""), BadRequestError, pb.MESSAGE_BODY_EMPTY),
        (Message("T", b"x" * (4 * 1024 * 1024 + 1)), PayloadTooLargeError, pb.MESSAGE_BODY_TOO_LARGE),
    ]
    for message, error_type, code in cases:
        with pytest.raises(error_type) as raised:
            await producer.send(message)
        assert raised.value.code == code, raised.value
        assert not raised.value.retriable and raised.value.message


async def test_a_batch_with_a_bad_message_fails_as_a_whole(cluster, producer):
    await create_topic(cluster, "WholeBatch", queues=1)
    with pytest.raises(BadRequestError) as raised:
        await producer.send_batch([Message("WholeBatch", b"good"), Message("WholeBatch", b"bad", tag="a||b")])
    assert raised.value.code == pb.ILLEGAL_MESSAGE_TAG
    assert await stored_messages(cluster, "WholeBatch") == []


async def test_a_closed_producer_refuses_to_send(cluster):
    producer = Producer(servers(cluster))
    with pytest.raises(PreconditionFailedError):
        await producer.send(Message("T", b"x"))  # not started
    await producer.start()
    await producer.close()
    with pytest.raises(PreconditionFailedError):
        await producer.send(Message("T", b"x"))


async def test_a_send_to_an_unknown_topic_creates_it_while_auto_creation_is_on(cluster, producer):
    receipt = await producer.send(Message("AutoCreated", b"x"))
    async with AdminClient(servers(cluster)) as admin:
        topics = {t.topic: t for t in await admin.list_topics()}
    assert topics["AutoCreated"].queues == 8 and topics["AutoCreated"].message_type == "mixed"
    assert receipt.offset == 0


async def test_a_producer_with_no_reachable_node_gives_up_at_its_deadline():
    started = time.monotonic()
    with pytest.raises(UnavailableError) as raised:
        async with Producer(f"127.0.0.1:{free_ports(1)[0]}", deadline_s=1.0):
            pass
    assert raised.value.code == pb.HA_NOT_AVAILABLE
    assert time.monotonic() - started < 5
