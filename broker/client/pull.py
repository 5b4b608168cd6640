"""PullConsumer: offset-based reading, for replay and for applications that
keep their own position (the protocol's PullMessage and offset RPCs).

    async with PullConsumer(servers, "Replayer") as consumer:
        for queue_id in await consumer.queue_ids("Orders"):
            offset = await consumer.committed("Orders", queue_id) or \\
                await consumer.query_offset("Orders", queue_id, OffsetPolicy.BEGINNING)
            batch = await consumer.pull("Orders", queue_id, offset, max_messages=100)
            ...
            await consumer.commit("Orders", queue_id, batch.next_offset)

Nothing is leased or acknowledged: a pull reads, a commit records where the
group stands (through the replicated log), and the group's committed offsets
show as its lag in the admin service.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

from google.protobuf.timestamp_pb2 import Timestamp

from broker.client.base import BaseClient
from broker.client.config import ClientConfig
from broker.client.errors import BadRequestError, check_status
from broker.client.message import ReceivedMessage, duration, from_protocol
from broker.client.groups import endpoints_addresses
from broker.client.routes import RouteCache
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb


class OffsetPolicy(enum.IntEnum):
    BEGINNING = pb.BEGINNING
    END = pb.END
    TIMESTAMP = pb.TIMESTAMP


_POLICIES: dict[OffsetPolicy, pb.QueryOffsetPolicy] = {
    OffsetPolicy.BEGINNING: pb.BEGINNING, OffsetPolicy.END: pb.END, OffsetPolicy.TIMESTAMP: pb.TIMESTAMP}


@dataclass(frozen=True)
class PullResult:
    messages: list[ReceivedMessage]
    next_offset: int


class PullConsumer(BaseClient):
    client_type = pb.PULL_CONSUMER

    def __init__(self, servers: str | Iterable[str] | ClientConfig, group: str, **config: Any) -> None:
        self.consumer_group = group
        super().__init__(servers, **config)
        self.routes = RouteCache(self.connection)

    def group(self) -> str | None:
        return self.consumer_group

    async def queue_ids(self, topic: str) -> list[int]:
        return [q.id for q in self._own((await self.routes.route(topic)).readable)]

    def _own(self, queues: list[pb.MessageQueue]) -> list[pb.MessageQueue]:
        """With several broker groups, the queues of the group the configured
        servers belong to: offsets and pulls are per group, and a pull goes
        to the configured servers."""
        if len({q.broker.name for q in queues}) <= 1:
            return queues
        mine = set(self.connection.servers)
        return [q for q in queues if mine & set(endpoints_addresses(q.broker.endpoints))]

    async def _queue(self, topic: str, queue_id: int) -> pb.MessageQueue:
        for refresh in (False, True):  # a queue an admin just added needs a fresh route
            for queue in self._own((await self.routes.route(topic, refresh=refresh)).queues):
                if queue.id == queue_id:
                    return queue
        raise BadRequestError(pb.BAD_REQUEST, f"topic {topic!r} has no queue {queue_id}")

    # ---------------------------------------------------------------- pull
    async def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                   expression: str = "*", await_duration_s: float = 0.0) -> PullResult:
        """Messages of one queue from `offset` (at most `max_messages`), and the
        offset to pull from next. With `await_duration_s` the broker waits that
        long for messages when none are there yet."""
        self.require_started()
        request = spb.PullMessageRequest(
            group=self.connection.resource(self.consumer_group), message_queue=await self._queue(topic, queue_id),
            offset=offset, batch_size=max_messages,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=expression),
            long_polling_timeout=duration(await_duration_s))
        return await self.connection.call(f"pull {topic}/{queue_id}@{offset}",
                                          lambda address: self._pull_once(address, request, offset, await_duration_s),
                                          long_poll=await_duration_s > 0)

    async def _pull_once(self, address: str, request: spb.PullMessageRequest, offset: int,
                         await_duration_s: float) -> PullResult:
        connection = self.connection
        call = connection.messaging(address).PullMessage(
            request, metadata=connection.headers(), timeout=await_duration_s + self.config.request_timeout_s)
        messages: list[ReceivedMessage] = []
        next_offset = offset
        status: pb.Status | None = None
        try:
            async for response in call:
                content = response.WhichOneof("content")
                if content == "message":
                    messages.append(from_protocol(response.message))
                elif content == "next_offset":
                    next_offset = response.next_offset
                elif content == "status":
                    status = response.status
        finally:
            call.cancel()
        if status is not None and status.code not in (pb.OK, pb.MESSAGE_NOT_FOUND):
            check_status(status, f"pull {request.message_queue.topic.name}/{request.message_queue.id}")
        if messages and next_offset <= offset:
            next_offset = messages[-1].queue_offset + 1
        return PullResult(messages, next_offset)

    # ------------------------------------------------------------- offsets
    async def commit(self, topic: str, queue_id: int, offset: int) -> None:
        """Record that the group goes on from `offset` in this queue."""
        self.require_started()
        request = spb.UpdateOffsetRequest(group=self.connection.resource(self.consumer_group),
                                          message_queue=await self._queue(topic, queue_id), offset=offset)

        async def attempt(address: str) -> None:
            answer = await self.connection.messaging(address).UpdateOffset(
                request, metadata=self.connection.headers(), timeout=self.config.request_timeout_s)
            check_status(answer.status, f"commit {topic}/{queue_id}@{offset}")

        await self.connection.call("UpdateOffset", attempt)

    async def committed(self, topic: str, queue_id: int) -> int | None:
        """The group's committed offset of a queue; None when it has none."""
        self.require_started()
        request = spb.GetOffsetRequest(group=self.connection.resource(self.consumer_group),
                                       message_queue=await self._queue(topic, queue_id))

        async def attempt(address: str) -> int | None:
            answer = await self.connection.messaging(address).GetOffset(
                request, metadata=self.connection.headers(), timeout=self.config.request_timeout_s)
            if answer.status.code == pb.OFFSET_NOT_FOUND:
                return None
            check_status(answer.status, f"committed offset of {topic}/{queue_id}")
            return answer.offset

        return await self.connection.call("GetOffset", attempt)

    async def query_offset(self, topic: str, queue_id: int, policy: OffsetPolicy = OffsetPolicy.BEGINNING,
                           timestamp: datetime | None = None) -> int:
        """The queue's first offset (BEGINNING), its end (END), or the first
        message stored at or after `timestamp` (TIMESTAMP)."""
        self.require_started()
        request = spb.QueryOffsetRequest(message_queue=await self._queue(topic, queue_id),
                                         query_offset_policy=_POLICIES[policy])
        if policy == OffsetPolicy.TIMESTAMP:
            if timestamp is None:
                raise BadRequestError(pb.BAD_REQUEST, "a TIMESTAMP query needs a timestamp")
            stamp = Timestamp()
            stamp.FromDatetime(timestamp)
            request.timestamp.CopyFrom(stamp)

        async def attempt(address: str) -> int:
            answer = await self.connection.messaging(address).QueryOffset(
                request, metadata=self.connection.headers(), timeout=self.config.request_timeout_s)
            check_status(answer.status, f"query offset of {topic}/{queue_id}")
            return answer.offset

        return await self.connection.call("QueryOffset", attempt)

