"""Consumption on three real node processes with raw gRPC stubs: pop receive
and ack (through a follower too), redelivery after the invisible duration,
ChangeInvisibleDuration, the dead-letter queue, tag filters, FIFO order per
message group, offset pull and the offset RPCs, long polling, and one test
per bad-input code."""
from __future__ import annotations

import asyncio
import time
import zlib
from collections import defaultdict

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from store.subscription_group import SubscriptionGroupConfig
from tests.integration.consume_helpers import (METADATA, ack, change_invisible, channels, consumer_settings,
                                               create_group, create_topic, message, receive, receive_raw,
                                               receive_request, send)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("consume"))
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def stubs(cluster):
    client = DLedgerClient(list(cluster.addresses.values()))
    leader = await find_leader(client, list(cluster.addresses.values()))
    await client.close()
    opened = channels(cluster.addresses)
    by_node = {node: service_pb2_grpc.MessagingServiceStub(ch) for node, ch in opened.items()}
    follower = next(node for node in by_node if node != leader)
    yield by_node[leader], by_node[follower]
    for channel in opened.values():
        await channel.close()


@pytest.fixture
def addresses(cluster) -> list[str]:
    return list(cluster.addresses.values())


def ids(messages: list[pb.Message]) -> list[str]:
    return [m.system_properties.message_id for m in messages]


def queue_of(message_group: str, queues: int = 8) -> int:
    return zlib.crc32(message_group.encode()) % queues   # as broker/send.py places FIFO messages


async def receive_dead_letters(stub, group: str, topic: str, count: int) -> list[pb.Message]:
    """The dead-letter topic appears with its first message (the revive
    service writes it): until then a receive answers TOPIC_NOT_FOUND."""
    deadline = time.monotonic() + 10
    got: list[pb.Message] = []
    while len(got) < count:
        status, messages = await receive_raw(stub, receive_request(group, topic, polling=10))
        if status.code == pb.TOPIC_NOT_FOUND and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            continue
        assert status.code == pb.OK and messages, status
        got.extend(messages)
    return got


async def receive_all(stub, group: str, topic: str, count: int, **kwargs) -> list[pb.Message]:
    got: list[pb.Message] = []
    while len(got) < count:
        batch = await receive(stub, group, topic, **kwargs)
        assert batch, f"only {len(got)} of {count} messages arrived"
        got.extend(batch)
    return got


# ------------------------------------------------------------ receive, ack


async def test_a_received_message_is_acked_once_and_never_delivered_again(stubs):
    leader, follower = stubs
    sent = await send(leader, *[message("Pop", b"m%d" % i, tag="A") for i in range(20)])
    got = await receive_all(follower, "PopGroup", "Pop", 20)          # through a follower: forwarded
    assert sorted(ids(got)) == sorted(sent)
    assert {m.system_properties.delivery_attempt for m in got} == {1}
    assert len({m.system_properties.receipt_handle for m in got}) == 20
    assert all(m.system_properties.invisible_duration.seconds == 10 for m in got)
    assert {m.body for m in got} == {b"m%d" % i for i in range(20)}
    answer = await ack(follower, "PopGroup", "Pop", *got)
    assert answer.status.code == pb.OK and [e.status.code for e in answer.entries] == [pb.OK] * 20
    again = await ack(leader, "PopGroup", "Pop", *got[:2])
    # The same ack again (a retry after a lost answer) is answered as the
    # first was, and changes nothing.
    assert again.status.code == pb.OK, again.status
    later = await send(leader, message("Pop", b"later"))
    assert ids(await receive(leader, "PopGroup", "Pop")) == later
    # Another group consumes the topic independently, from its first message.
    assert len(await receive_all(leader, "OtherPopGroup", "Pop", 21)) == 21


async def test_a_batched_response_carries_the_batch_with_the_status_and_plain_ones_a_message_each(stubs):
    leader, follower = stubs
    sent = await send(leader, *[message("PopBatched", b"b%d" % i) for i in range(10)])
    for stub, group in ((leader, "BatchedGroup"), (follower, "BatchedViaFollower")):  # forwarded too
        request = receive_request(group, "PopBatched")
        request.batched_response = True
        responses = [r async for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=10)]
        kinds = [r.WhichOneof("content") for r in responses]
        assert kinds == ["status", "delivery_timestamp"], kinds      # two writes for the whole batch
        assert responses[0].status.code == pb.OK
        assert sorted(ids(list(responses[0].messages))) == sorted(sent)
        assert all(m.system_properties.receipt_handle for m in responses[0].messages)
        answer = await ack(stub, group, "PopBatched", *responses[0].messages)
        assert [e.status.code for e in answer.entries] == [pb.OK] * 10
    # A receive without the flag (the official clients') is as the protocol has it.
    request = receive_request("PlainGroup", "PopBatched")
    responses = [r async for r in leader.ReceiveMessage(request, metadata=METADATA, timeout=10)]
    assert [r.WhichOneof("content") for r in responses] == ["status", "delivery_timestamp"] + ["message"] * 10
    assert not any(r.messages for r in responses)


async def test_consumed_offsets_reach_get_offset_and_the_consumer_offset_table(stubs, addresses):
    leader, _ = stubs
    await create_topic(addresses, leader, "PopOffsets", queues=1)
    await send(leader, *[message("PopOffsets", b"%d" % i) for i in range(5)])
    got = await receive(leader, "PopOffsetsGroup", "PopOffsets")
    assert len(got) == 5
    await ack(leader, "PopOffsetsGroup", "PopOffsets", *got[:2], *got[3:])
    queue = pb.MessageQueue(topic=pb.Resource(name="PopOffsets"), id=0)
    offset = await leader.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="PopOffsetsGroup"),
                                                         message_queue=queue), metadata=METADATA, timeout=5)
    assert (offset.status.code, offset.offset) == (pb.OK, 2)   # offset 2 is still in flight
    await ack(leader, "PopOffsetsGroup", "PopOffsets", got[2])
    offset = await leader.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="PopOffsetsGroup"),
                                                         message_queue=queue), metadata=METADATA, timeout=5)
    assert offset.offset == 5


async def test_an_unacked_message_comes_back_after_its_invisible_duration_with_the_attempt_raised(stubs):
    leader, _ = stubs
    sent = await send(leader, message("Redeliver", b"again"))
    first = await receive(leader, "RedeliverGroup", "Redeliver")
    assert ids(first) == sent
    started = time.monotonic()
    # The long poll wakes when the lease runs out, not at its own timeout.
    second = await receive(leader, "RedeliverGroup", "Redeliver", polling=20)
    waited = time.monotonic() - started
    assert ids(second) == sent and 8.5 < waited < 14, waited
    assert second[0].system_properties.delivery_attempt == 2
    assert second[0].system_properties.receipt_handle != first[0].system_properties.receipt_handle
    stale = await ack(leader, "RedeliverGroup", "Redeliver", first[0])
    assert stale.status.code == pb.INVALID_RECEIPT_HANDLE
    assert (await ack(leader, "RedeliverGroup", "Redeliver", second[0])).status.code == pb.OK


async def test_change_invisible_duration_returns_the_handle_to_use_and_zero_redelivers_at_once(stubs):
    leader, follower = stubs
    sent = await send(leader, message("Change", b"c"))
    first = (await receive(leader, "ChangeGroup", "Change", invisible=60))[0]
    handle = first.system_properties.receipt_handle
    longer = await change_invisible(follower, "ChangeGroup", "Change", handle, 120)
    assert longer.status.code == pb.OK and longer.receipt_handle != handle
    stale = await change_invisible(leader, "ChangeGroup", "Change", handle, 0)
    assert stale.status.code == pb.INVALID_RECEIPT_HANDLE
    now = await change_invisible(leader, "ChangeGroup", "Change", longer.receipt_handle, 0)
    assert now.status.code == pb.OK
    again = await receive(leader, "ChangeGroup", "Change")
    assert ids(again) == sent and again[0].system_properties.delivery_attempt == 2
    assert (await ack(leader, "ChangeGroup", "Change", again[0])).status.code == pb.OK


async def test_a_retried_receive_with_the_same_attempt_id_gets_the_same_batch(stubs):
    leader, _ = stubs
    await send(leader, *[message("Attempt", b"%d" % i) for i in range(3)])
    first = await receive(leader, "AttemptGroup", "Attempt", attempt_id="attempt-1")
    retried = await receive(leader, "AttemptGroup", "Attempt", attempt_id="attempt-1")
    assert len(first) == 3
    assert [m.system_properties.receipt_handle for m in retried] == [m.system_properties.receipt_handle
                                                                     for m in first]


# ------------------------------------------------------------- dead letters


async def test_after_the_groups_max_attempts_a_message_goes_to_the_dead_letter_queue(stubs, addresses):
    leader, _ = stubs
    await create_topic(addresses, leader, "Dead", queues=1)
    settings = await consumer_settings(leader, "DeadGroup")
    assert settings.backoff_policy.max_attempts == 17          # retry_max_times 16, plus the first delivery
    assert len(settings.backoff_policy.customized_backoff.next) == 16
    sent = await send(leader, message("Dead", b"poison", tag="P", keys=["k1"]))
    attempts = []
    for _ in range(17):
        got = await receive(leader, "DeadGroup", "Dead")
        assert ids(got) == sent
        attempts.append(got[0].system_properties.delivery_attempt)
        nack = await change_invisible(leader, "DeadGroup", "Dead", got[0].system_properties.receipt_handle, 0)
        assert nack.status.code == pb.OK
    assert attempts == list(range(1, 18))
    dead = await receive_dead_letters(leader, "DeadReader", "%DLQ%DeadGroup", 1)
    assert ids(dead) == sent and dead[0].body == b"poison"
    origin = dead[0].system_properties.dead_letter_queue
    assert (origin.topic, origin.message_id) == ("Dead", sent[0])
    assert dead[0].system_properties.tag == "P" and list(dead[0].system_properties.keys) == ["k1"]
    consumed = await leader.GetOffset(spb.GetOffsetRequest(
        group=pb.Resource(name="DeadGroup"), message_queue=pb.MessageQueue(topic=pb.Resource(name="Dead"), id=0)),
        metadata=METADATA, timeout=5)
    assert consumed.offset == 1     # the original is consumed: it will not come back


async def test_a_group_with_fewer_retries_dead_letters_sooner_and_a_consumer_can_forward(stubs, addresses):
    leader, _ = stubs
    await create_group(addresses, leader, SubscriptionGroupConfig("ShortGroup", retry_max_times=1))
    sent = await send(leader, message("Short", b"s1"), message("Short", b"s2"))
    got = await receive_all(leader, "ShortGroup", "Short", 2)
    by_body = {m.body: m for m in got}
    forwarded = await leader.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="ShortGroup"), topic=pb.Resource(name="Short"),
        receipt_handle=by_body[b"s1"].system_properties.receipt_handle,
        message_id=by_body[b"s1"].system_properties.message_id, delivery_attempt=1, max_delivery_attempts=2),
        metadata=METADATA, timeout=10)
    assert forwarded.status.code == pb.OK
    assert (await ack(leader, "ShortGroup", "Short", by_body[b"s1"])).status.code == pb.INVALID_RECEIPT_HANDLE
    await change_invisible(leader, "ShortGroup", "Short", by_body[b"s2"].system_properties.receipt_handle, 0)
    second = await receive(leader, "ShortGroup", "Short")
    assert [m.body for m in second] == [b"s2"] and second[0].system_properties.delivery_attempt == 2
    await change_invisible(leader, "ShortGroup", "Short", second[0].system_properties.receipt_handle, 0)
    dead = await receive_dead_letters(leader, "ShortReader", "%DLQ%ShortGroup", 2)
    assert sorted(ids(dead)) == sorted(sent)


# -------------------------------------------------------------- tag filters


async def test_a_tag_filter_delivers_only_the_tags_it_names(stubs):
    leader, _ = stubs
    tagged = [message("Tags", b"%s%d" % (tag.encode(), i), tag=tag) for i in range(4) for tag in "ABC"]
    await send(leader, *tagged, message("Tags", b"untagged"))
    got = await receive_all(leader, "TagsAB", "Tags", 8, expression="A || B")
    assert sorted(m.system_properties.tag for m in got) == ["A"] * 4 + ["B"] * 4
    assert len(await receive_all(leader, "TagsAll", "Tags", 13, expression="*")) == 13
    only_c = await receive_all(leader, "TagsC", "Tags", 4, expression="C")
    assert {m.system_properties.tag for m in only_c} == {"C"}


# ---------------------------------------------------------------------- FIFO


async def test_fifo_groups_get_each_message_group_in_order_one_batch_at_a_time(stubs, addresses):
    leader, follower = stubs
    await create_group(addresses, leader, SubscriptionGroupConfig("FifoGroup", consume_message_orderly=True))
    groups, per_group = [f"order-{g}" for g in range(24)], 12
    batch = [message("Fifo", f"{g}:{i}".encode(), message_group=g) for i in range(per_group) for g in groups]
    for start in range(0, len(batch), 48):
        await send(leader, *batch[start:start + 48])
    received: dict[str, list[int]] = defaultdict(list)
    holding: dict[str, str] = {}          # message group -> the consumer that holds unacked messages of it
    done = asyncio.Event()

    async def consumer(name: str, stub) -> None:
        while not done.is_set():
            got = await receive(stub, "FifoGroup", "Fifo", batch=8, polling=5)
            for m in got:
                group = m.system_properties.message_group
                assert holding.get(group, name) == name, f"{group} is in flight at two consumers"
                holding[group] = name
                received[group].append(int(m.body.split(b":")[1]))
            await asyncio.sleep(0.01)  # hold them a moment: another consumer's receive runs meanwhile
            for m in got:
                holding.pop(m.system_properties.message_group, None)
            if got:
                answer = await ack(stub, "FifoGroup", "Fifo", *got)
                assert answer.status.code == pb.OK, answer.status
            if sum(map(len, received.values())) >= len(batch):
                done.set()

    consumers = [asyncio.ensure_future(consumer(f"c{i}", stub))
                 for i, stub in enumerate([leader, follower, leader, follower])]
    await asyncio.wait_for(done.wait(), 60)
    for task in consumers:       # the others may sit in a long poll
        task.cancel()
    for task in consumers:
        try:
            await task
        except asyncio.CancelledError:
            pass
    assert {g: order for g, order in received.items()} == {g: list(range(per_group)) for g in groups}


async def test_a_fifo_message_delivered_again_holds_back_the_messages_behind_it(stubs, addresses):
    leader, _ = stubs
    await create_group(addresses, leader, SubscriptionGroupConfig("FifoRetry", consume_message_orderly=True))
    queue = queue_of("held")
    other = next(f"free-{i}" for i in range(100) if queue_of(f"free-{i}") == queue)
    await send(leader, *[message("FifoHeld", b"held:%d" % i, message_group="held") for i in range(3)],
               message("FifoHeld", b"free:0", message_group=other))
    first = await receive(leader, "FifoRetry", "FifoHeld", batch=1, queue=queue)
    assert [m.body for m in first] == [b"held:0"]
    # Its group is busy: the other group's message goes past it.
    assert [m.body for m in await receive(leader, "FifoRetry", "FifoHeld", queue=queue)] == [b"free:0"]
    await change_invisible(leader, "FifoRetry", "FifoHeld", first[0].system_properties.receipt_handle, 0)
    again = await receive(leader, "FifoRetry", "FifoHeld", batch=1, queue=queue)
    assert [m.body for m in again] == [b"held:0"] and again[0].system_properties.delivery_attempt == 2
    await ack(leader, "FifoRetry", "FifoHeld", again[0])
    rest = await receive(leader, "FifoRetry", "FifoHeld", queue=queue)
    assert [m.body for m in rest] == [b"held:1", b"held:2"]


# ------------------------------------------------------------ long polling


async def test_a_waiting_receive_returns_soon_after_a_send(stubs, addresses):
    leader, follower = stubs
    await create_topic(addresses, leader, "Poll", queues=2)
    waiting = asyncio.ensure_future(receive(follower, "PollGroup", "Poll", polling=20))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    sent_at = time.monotonic()
    sent = await send(leader, message("Poll", b"wake"))
    got = await asyncio.wait_for(waiting, 20)
    assert ids(got) == sent and time.monotonic() - sent_at < 1.0


# ------------------------------------------------------------------ offsets


async def pull(stub, group: str, topic: str, offset: int, batch: int = 32, polling: float = 0, queue: int = 0,
               expression: str = "*") -> tuple[pb.Status, list[pb.Message], int | None]:
    request = spb.PullMessageRequest(group=pb.Resource(name=group),
                                     message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
                                     offset=offset, batch_size=batch,
                                     filter_expression=pb.FilterExpression(type=pb.TAG, expression=expression),
                                     long_polling_timeout=Duration(seconds=int(polling)))
    statuses, messages, next_offset = [], [], None
    async for response in stub.PullMessage(request, metadata=METADATA, timeout=polling + 10):
        kind = response.WhichOneof("content")
        if kind == "status":
            statuses.append(response.status)
        elif kind == "message":
            messages.append(response.message)
        else:
            next_offset = response.next_offset
    assert len(statuses) == 1
    return statuses[0], messages, next_offset


async def test_pull_by_offset_and_the_offset_rpcs(stubs, addresses):
    leader, follower = stubs
    await create_topic(addresses, leader, "Replay", queues=1)
    before = int(time.time() * 1000) - 1
    await send(leader, *[message("Replay", b"r%d" % i, tag="even" if i % 2 == 0 else "odd") for i in range(10)])
    queue = pb.MessageQueue(topic=pb.Resource(name="Replay"), id=0)

    async def query(policy: int, timestamp_ms: int | None = None) -> int:
        request = spb.QueryOffsetRequest(message_queue=queue, query_offset_policy=policy)
        if timestamp_ms is not None:
            request.timestamp.CopyFrom(Timestamp(seconds=timestamp_ms // 1000, nanos=timestamp_ms % 1000 * 10**6))
        answer = await follower.QueryOffset(request, metadata=METADATA, timeout=5)
        assert answer.status.code == pb.OK, answer.status
        return answer.offset

    assert await query(pb.BEGINNING) == 0 and await query(pb.END) == 10
    assert await query(pb.TIMESTAMP, before) == 0 and await query(pb.TIMESTAMP, before + 3_600_000) == 10
    status, first, next_offset = await pull(follower, "Replayer", "Replay", 0, batch=4)
    assert status.code == pb.OK and [m.body for m in first] == [b"r0", b"r1", b"r2", b"r3"] and next_offset == 4
    assert [m.system_properties.queue_offset for m in first] == [0, 1, 2, 3]
    _, rest, next_offset = await pull(leader, "Replayer", "Replay", 4)
    assert len(rest) == 6 and next_offset == 10
    _, even, _ = await pull(leader, "Replayer", "Replay", 0, expression="even")
    assert [m.body for m in even] == [b"r0", b"r2", b"r4", b"r6", b"r8"]
    # At the end a pull waits, and answers soon after a send.
    started = time.monotonic()
    waiting = asyncio.ensure_future(pull(leader, "Replayer", "Replay", 10, polling=10))
    await asyncio.sleep(0.5)
    await send(leader, message("Replay", b"r10"))
    status, newest, next_offset = await waiting
    assert [m.body for m in newest] == [b"r10"] and next_offset == 11 and time.monotonic() - started < 3
    group = pb.Resource(name="Replayer")
    missing = await leader.GetOffset(spb.GetOffsetRequest(group=group, message_queue=queue), metadata=METADATA,
                                     timeout=5)
    assert missing.status.code == pb.OFFSET_NOT_FOUND
    updated = await follower.UpdateOffset(spb.UpdateOffsetRequest(group=group, message_queue=queue, offset=7),
                                          metadata=METADATA, timeout=5)
    assert updated.status.code == pb.OK
    got = await leader.GetOffset(spb.GetOffsetRequest(group=group, message_queue=queue), metadata=METADATA,
                                 timeout=5)
    assert (got.status.code, got.offset) == (pb.OK, 7)


async def test_an_offset_reset_moves_a_pop_group(stubs, addresses):
    leader, _ = stubs
    await create_topic(addresses, leader, "Reset", queues=1)
    await send(leader, *[message("Reset", b"%d" % i) for i in range(4)])
    got = await receive(leader, "ResetGroup", "Reset")
    await ack(leader, "ResetGroup", "Reset", *got)
    queue = pb.MessageQueue(topic=pb.Resource(name="Reset"), id=0)
    reset = await leader.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name="ResetGroup"),
                                                              message_queue=queue, offset=1), metadata=METADATA,
                                      timeout=5)
    assert reset.status.code == pb.OK
    assert [m.body for m in await receive(leader, "ResetGroup", "Reset")] == [b"1", b"2", b"3"]


# ---------------------------------------------------------------- bad input


async def _expired_handle(stub) -> str:
    await send(stub, message("BadInput", b"x"))
    got = await receive(stub, "BadInputGroup", "BadInput", batch=1)
    nack = await change_invisible(stub, "BadInputGroup", "BadInput", got[0].system_properties.receipt_handle, 0)
    return nack.receipt_handle   # valid until now: already expired


async def test_a_batched_receive_may_ask_for_more_than_the_protocols_32_up_to_128(stubs):
    leader, follower = stubs
    await send(leader, *[message("PopBig", b"m%d" % i) for i in range(100)])
    for stub, group in ((leader, "BigBatch"), (follower, "BigBatchViaFollower")):
        request = receive_request(group, "PopBig", batch=64)
        request.batched_response = True
        responses = [r async for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=10)]
        assert responses[0].status.code == pb.OK, responses[0].status
        assert 32 < len(responses[0].messages) <= 64
        answer = await ack(stub, group, "PopBig", *responses[0].messages)
        assert {e.status.code for e in answer.entries} == {pb.OK}
        for batch, code in ((128, pb.OK), (129, pb.BAD_REQUEST)):
            request = receive_request(group, "PopBig", batch=batch, polling=1)
            request.batched_response = True
            responses = [r async for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=10)]
            assert responses[0].status.code == code, (batch, responses[0].status)
    # Without the flag (an official client, here through a follower too) the protocol's limit holds.
    for stub in (leader, follower):
        status, messages = await receive_raw(stub, receive_request("PlainBig", "PopBig", batch=64))
        assert status.code == pb.BAD_REQUEST and "1..32" in status.message and messages == []


async def _foreign_handle(stub) -> str:
    await send(stub, message("BadInput", b"y"))
    got = await receive(stub, "ForeignGroup", "BadInput", batch=1)
    return got[0].system_properties.receipt_handle


@pytest.mark.parametrize("request_, code, timeout", [
    (lambda: receive_request("bad group!", "Pop"), pb.ILLEGAL_CONSUMER_GROUP, None),
    (lambda: receive_request("G", "bad topic!"), pb.ILLEGAL_TOPIC, None),
    (lambda: receive_request("G", "NoSuchTopicAnywhere"), pb.TOPIC_NOT_FOUND, None),
    (lambda: receive_request("G", "Pop", expression="A ||"), pb.ILLEGAL_FILTER_EXPRESSION, None),
    (lambda: receive_request("G", "Pop", expression="a > 1", filter_type=pb.SQL), pb.ILLEGAL_FILTER_EXPRESSION, None),
    (lambda: receive_request("G", "Pop", invisible=1), pb.ILLEGAL_INVISIBLE_TIME, None),
    (lambda: receive_request("G", "Pop", invisible=13 * 3600), pb.ILLEGAL_INVISIBLE_TIME, None),
    (lambda: receive_request("G", "Pop", invisible=None), pb.ILLEGAL_INVISIBLE_TIME, None),
    (lambda: receive_request("G", "Pop"), pb.ILLEGAL_POLLING_TIME, 2.0),
    (lambda: receive_request("G", "Pop", batch=0), pb.BAD_REQUEST, None),
    (lambda: receive_request("G", "Pop", batch=33), pb.BAD_REQUEST, None),
], ids=["group", "topic", "unknown-topic", "filter", "sql-filter", "invisible-short", "invisible-long",
        "invisible-missing", "polling", "batch-zero", "batch-large"])
async def test_a_bad_receive_gets_the_protocols_code(stubs, request_, code, timeout):
    leader, follower = stubs
    for stub in (leader, follower):
        status, messages = await receive_raw(stub, request_(), timeout=timeout or 10)
        assert status.code == code, status
        assert status.message and messages == []


async def test_a_receive_without_a_client_id_is_refused(stubs):
    leader, _ = stubs
    status, _ = await receive_raw(leader, receive_request("G", "Pop"), metadata=[])
    assert status.code == pb.CLIENT_ID_REQUIRED


@pytest.mark.parametrize("handle, reason", [
    (lambda stub: asyncio.sleep(0, "garbage"), "not a receipt handle"),
    (_expired_handle, "expired"),
    (_foreign_handle, "not issued to consumer group"),
], ids=["illegal", "expired", "foreign"])
async def test_a_bad_receipt_handle_is_refused_by_ack_change_and_forward(stubs, handle, reason):
    leader, follower = stubs
    text = await handle(leader)
    acked = await ack(follower, "BadInputGroup", "BadInput", handles=[text])
    assert acked.status.code == pb.INVALID_RECEIPT_HANDLE and reason in acked.status.message, acked.status
    changed = await change_invisible(leader, "BadInputGroup", "BadInput", text, 30)
    assert changed.status.code == pb.INVALID_RECEIPT_HANDLE, changed.status
    forwarded = await leader.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="BadInputGroup"), topic=pb.Resource(name="BadInput"), receipt_handle=text),
        metadata=METADATA, timeout=10)
    assert forwarded.status.code == pb.INVALID_RECEIPT_HANDLE


async def test_an_illegal_invisible_duration_change_is_refused(stubs):
    leader, _ = stubs
    await send(leader, message("BadInput", b"z"))
    got = await receive(leader, "ChangeBad", "BadInput", batch=1)
    for seconds in (13 * 3600, -1):
        answer = await change_invisible(leader, "ChangeBad", "BadInput", got[0].system_properties.receipt_handle,
                                        seconds)
        assert answer.status.code == pb.ILLEGAL_INVISIBLE_TIME, answer.status


async def test_illegal_offsets_are_refused_with_where_to_go_on(stubs, addresses):
    leader, _ = stubs
    await create_topic(addresses, leader, "OffsetBad", queues=1)
    await send(leader, message("OffsetBad", b"only"))
    status, _, _ = await pull(leader, "OffsetBadGroup", "OffsetBad", -1)
    assert status.code == pb.ILLEGAL_OFFSET
    status, _, next_offset = await pull(leader, "OffsetBadGroup", "OffsetBad", 5)
    assert status.code == pb.ILLEGAL_OFFSET and next_offset == 1 and "past its end" in status.message
    update = await leader.UpdateOffset(spb.UpdateOffsetRequest(
        group=pb.Resource(name="OffsetBadGroup"), message_queue=pb.MessageQueue(topic=pb.Resource(name="OffsetBad"),
                                                                                id=0), offset=2),
        metadata=METADATA, timeout=5)
    assert update.status.code == pb.ILLEGAL_OFFSET
    bad_queue = await leader.GetOffset(spb.GetOffsetRequest(
        group=pb.Resource(name="OffsetBadGroup"), message_queue=pb.MessageQueue(topic=pb.Resource(name="OffsetBad"),
                                                                                id=3)), metadata=METADATA, timeout=5)
    assert bad_queue.status.code == pb.BAD_REQUEST
