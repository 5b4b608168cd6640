"""Raw-stub helpers for the consumption tests: send, receive, ack, and
creating topics and consumer groups with settings no RPC of the RocketMQ
protocol sets (FIFO, retry_max_times, a queue count) through our AdminService."""
from __future__ import annotations

import asyncio
import time
import uuid

import grpc
from google.protobuf.duration_pb2 import Duration

from broker.client.admin import AdminClient
from broker.client.errors import ClientError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from store.subscription_group import SubscriptionGroupConfig

METADATA = [("x-mq-client-id", "consume-test@1")]
Stub = service_pb2_grpc.MessagingServiceStub


def message(topic: str, body: bytes = b"hello", **system: object) -> pb.Message:
    properties = pb.SystemProperties(message_id=str(system.pop("message_id", "01" + uuid.uuid4().hex.upper())),
                                     born_host="127.0.0.1", **system)  # type: ignore[arg-type]
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=properties)


async def send(stub: Stub, *messages: pb.Message) -> list[str]:
    """Send; returns the message ids (asserting every one was stored)."""
    answer = await stub.SendMessage(spb.SendMessageRequest(messages=list(messages)), metadata=METADATA, timeout=15)
    assert answer.status.code == pb.OK, answer.status
    return [entry.message_id for entry in answer.entries]


def receive_request(group: str, topic: str, batch: int = 32, invisible: float | None = 10, polling: float = 5,
                    queue: int = 0, expression: str = "*", filter_type: int = pb.TAG,
                    attempt_id: str | None = None) -> spb.ReceiveMessageRequest:
    request = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
        filter_expression=pb.FilterExpression(type=filter_type, expression=expression), batch_size=batch,
        long_polling_timeout=Duration(seconds=int(polling), nanos=int(polling % 1 * 1e9)))
    if invisible is not None:
        request.invisible_duration.CopyFrom(Duration(seconds=int(invisible), nanos=int(invisible % 1 * 1e9)))
    if attempt_id is not None:
        request.attempt_id = attempt_id
    return request


async def receive_raw(stub: Stub, request: spb.ReceiveMessageRequest, timeout: float | None = None,
                      metadata: list[tuple[str, str]] = METADATA) -> tuple[pb.Status, list[pb.Message]]:
    """(the one status, the messages) of a ReceiveMessage call."""
    if timeout is None:
        timeout = request.long_polling_timeout.ToTimedelta().total_seconds() + 5
    statuses, messages = [], []
    async for response in stub.ReceiveMessage(request, metadata=metadata, timeout=timeout):
        if response.HasField("status"):
            statuses.append(response.status)
        elif response.HasField("message"):
            messages.append(response.message)
    assert len(statuses) == 1, f"expected exactly one status entry, got {statuses}"
    return statuses[0], messages


async def receive(stub: Stub, group: str, topic: str, **kwargs: object) -> list[pb.Message]:
    status, messages = await receive_raw(stub, receive_request(group, topic, **kwargs))  # type: ignore[arg-type]
    assert status.code == pb.OK, status
    return messages


async def ack(stub: Stub, group: str, topic: str, *messages: pb.Message,
              handles: list[str] | None = None) -> spb.AckMessageResponse:
    handles = handles if handles is not None else [m.system_properties.receipt_handle for m in messages]
    ids = [m.system_properties.message_id for m in messages] or [""] * len(handles)
    return await stub.AckMessage(spb.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic),
        entries=[spb.AckMessageEntry(message_id=i, receipt_handle=h) for i, h in zip(ids, handles)]),
        metadata=METADATA, timeout=10)


async def change_invisible(stub: Stub, group: str, topic: str, handle: str, seconds: float
                           ) -> spb.ChangeInvisibleDurationResponse:
    return await stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle=handle,
        invisible_duration=Duration(seconds=int(seconds), nanos=int(seconds % 1 * 1e9))), metadata=METADATA,
        timeout=10)


# ------------------------------------------------------- topics and groups


async def create_topic(addresses: list[str], stub: Stub, topic: str, queues: int, message_type: str = "MIXED") -> None:
    async with AdminClient(addresses) as admin:
        try:
            await admin.create_topic(topic, queues, message_type.lower())
        except ClientError:   # it exists, with other settings
            await admin.update_topic(topic, queues, message_type.lower())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:   # QueryOffset creates nothing: it finds the topic once applied
        answer = await stub.QueryOffset(spb.QueryOffsetRequest(
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0)), metadata=METADATA, timeout=5)
        if answer.status.code == pb.OK:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"topic {topic} did not appear")


async def create_group(addresses: list[str], stub: Stub, config: SubscriptionGroupConfig) -> pb.Settings:
    """Write the group's config, then wait until the leader's Telemetry
    settings for a consumer of it reflect it; returns those settings."""
    async with AdminClient(addresses) as admin:
        _, created = await admin.create_group(config.group_name, config.retry_max_times,
                                              config.consume_message_orderly)
        if not created:
            await admin.update_group(config.group_name, config.retry_max_times, config.consume_message_orderly)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        settings = await consumer_settings(stub, config.group_name)
        if settings.backoff_policy.max_attempts == config.retry_max_times + 1 and \
                settings.subscription.fifo == config.consume_message_orderly:
            return settings
        await asyncio.sleep(0.05)
    raise TimeoutError(f"group {config.group_name} did not appear")


async def consumer_settings(stub: Stub, group: str) -> pb.Settings:
    """What the broker answers a simple consumer of `group` on Telemetry."""
    settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(name=group)))
    settings.request_timeout.FromSeconds(3)
    queue: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()
    await queue.put(spb.TelemetryCommand(settings=settings))

    async def commands():
        while (command := await queue.get()) is not None:
            yield command

    call = stub.Telemetry(commands(), metadata=[("x-mq-client-id", f"settings-probe@{uuid.uuid4().hex[:8]}")])
    try:
        async for answer in call:
            assert answer.status.code == pb.OK, answer.status
            return answer.settings
    finally:
        await queue.put(None)
        call.cancel()
    raise AssertionError("the Telemetry stream ended without settings")


def channels(addresses: dict[str, str]) -> dict[str, grpc.aio.Channel]:
    return {node: grpc.aio.insecure_channel(address) for node, address in addresses.items()}
