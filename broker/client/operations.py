"""OperationsClient: message query, consumer progress, offset reset, resend
and dead letters (pydledger.admin.v1.OperationsService).

    async with OperationsClient(servers) as ops:
        found = await ops.query_by_key("Orders", "order-42")
        await ops.reset_offset("OrderGroup", "Orders", to_time_ms=yesterday_ms)
        progress = await ops.group_progress("OrderGroup")

Queries are answered by whichever node is asked, from its committed data:
they go to the servers in the order given (the next when one is down), so
`OperationsClient("follower:port")` reads a follower. Changes go to the
leader (any node would forward them) and are retried across a leader change.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Iterable

import grpc

from broker.client.config import ClientConfig
from broker.client.connection import Connection
from broker.client.errors import ClientError, check_status, transport_error
from rpcgen.pydledger.admin.v1 import operations_pb2 as opb
from rpcgen.pydledger.admin.v1 import operations_pb2_grpc

STATE_NAMES = {opb.PENDING: "pending", opb.IN_FLIGHT: "in_flight", opb.AWAITING_REDELIVERY: "awaiting_redelivery",
               opb.BLOCKED: "blocked", opb.CONSUMED: "consumed"}


@dataclass(frozen=True)
class Delivery:
    group: str
    state: str
    attempts: int
    lease_deadline_ms: int


@dataclass(frozen=True)
class MessageView:
    """A stored message, whole, as a query answers it."""
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    offset_message_id: str
    message_id: str
    tag: str
    keys: list[str]
    properties: dict[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    body: bytes
    delivery: Delivery | None = None

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("body", "delivery")}
        data["body_base64"] = base64.b64encode(self.body).decode("ascii")
        data["body_size"] = len(self.body)
        if self.delivery is not None:
            data["delivery"] = dict(self.delivery.__dict__)
        return data


@dataclass(frozen=True)
class QueueProgress:
    topic: str
    queue_id: int
    committed_offset: int
    min_offset: int
    max_offset: int
    lag: int
    in_flight: int
    retrying: int
    expired: int
    blocked: int
    last_consumed_store_ms: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GroupProgress:
    group: str
    queues: list[QueueProgress]
    total_lag: int
    dead_letters: int
    dead_letters_by_topic: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "total_lag": self.total_lag, "dead_letters": self.dead_letters,
                "dead_letters_by_topic": self.dead_letters_by_topic, "queues": [q.to_json() for q in self.queues]}


@dataclass(frozen=True)
class QueueReset:
    queue_id: int
    previous_offset: int
    offset: int


class OperationsClient:
    def __init__(self, servers: str | Iterable[str] | ClientConfig, **config: Any) -> None:
        self.config = ClientConfig.of(servers, **config)
        self.connection = Connection(self.config)

    async def __aenter__(self) -> "OperationsClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    # ---------------------------------------------------------------- queries
    async def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0, max_results: int = 0,
                           group: str = "") -> list[MessageView]:
        request = opb.QueryMessageByKeyRequest(topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms,
                                               max=max_results, group=group)
        return views_of(await self._query("QueryMessageByKey", request, f"query {topic!r} by key {key!r}"))

    async def query_by_id(self, message_id: str, topic: str = "", group: str = "") -> list[MessageView]:
        request = opb.QueryMessageByIdRequest(message_id=message_id, topic=topic, group=group)
        return views_of(await self._query("QueryMessageById", request, f"query message {message_id!r}"))

    async def query_by_offset(self, topic: str, queue_id: int, offset: int, count: int = 1,
                              group: str = "") -> tuple[list[MessageView], int]:
        request = opb.QueryMessageByOffsetRequest(topic=topic, queue_id=queue_id, offset=offset, count=count,
                                                  group=group)
        answer = await self._query("QueryMessageByOffset", request, f"query {topic}/{queue_id}@{offset}")
        return views_of(answer), answer.next_offset

    async def query_by_time(self, topic: str, queue_id: int, timestamp_ms: int, count: int = 1,
                            group: str = "") -> tuple[list[MessageView], int]:
        """From the first offset stored at or after `timestamp_ms` (searchOffset)."""
        request = opb.QueryMessageByOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms,
                                                  count=count, group=group)
        answer = await self._query("QueryMessageByOffset", request, f"query {topic}/{queue_id} at {timestamp_ms}")
        return views_of(answer), answer.next_offset

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms` (the queue's end when none)."""
        found, next_offset = await self.query_by_time(topic, queue_id, timestamp_ms, 1)
        return found[0].queue_offset if found else next_offset

    async def dead_letters(self, group: str, max_results: int = 0, before_offset: int = 0
                           ) -> tuple[list[MessageView], int]:
        request = opb.ListDeadLettersRequest(group=group, max=max_results, before_offset=before_offset)
        answer = await self._query("ListDeadLetters", request, f"dead letters of {group!r}")
        return views_of(answer), answer.next_offset

    # ----------------------------------------------------------- on the leader
    async def resend(self, message_id: str, group: str, topic: str = "") -> MessageView:
        request = opb.ResendMessageRequest(message_id=message_id, topic=topic, group=group)
        answer = await self._call("ResendMessage", request, f"resend {message_id} to {group!r}")
        return view_of(answer.message)

    async def resend_dead_letter(self, group: str, message_id: str) -> MessageView:
        request = opb.ResendDeadLetterRequest(group=group, message_id=message_id)
        answer = await self._call("ResendDeadLetter", request, f"resend dead letter {message_id} to {group!r}")
        return view_of(answer.message)

    async def group_progress(self, group: str, topic: str = "") -> GroupProgress:
        answer = await self._call("GroupProgress", opb.GroupProgressRequest(group=group, topic=topic),
                                  f"progress of {group!r}")
        return GroupProgress(group, [QueueProgress(
            q.topic, q.queue_id, q.committed_offset, q.min_offset, q.max_offset, q.lag, q.in_flight, q.retrying,
            q.expired, q.blocked, q.last_consumed_store_ms) for q in answer.queues], answer.total_lag,
            answer.dead_letters, {t.topic: t.count for t in answer.dead_letters_by_topic})

    async def reset_offset(self, group: str, topic: str, *, to_time_ms: int | None = None, to: str | None = None,
                           queue_id: int | None = None, offset: int | None = None) -> list[QueueReset]:
        """Exactly one of: `to_time_ms`; `to` ("earliest" or "latest"); `queue_id` with `offset`."""
        request = opb.ResetOffsetRequest(group=group, topic=topic)
        chosen = [to_time_ms is not None, to is not None, queue_id is not None or offset is not None]
        if sum(chosen) != 1:
            raise ValueError("reset to exactly one of: a time, earliest or latest, a queue and an offset")
        if to_time_ms is not None:
            request.timestamp_ms = to_time_ms
        elif to is not None:
            if to not in ("earliest", "latest"):
                raise ValueError(f"reset to earliest or latest, not {to!r}")
            request.position = opb.EARLIEST if to == "earliest" else opb.LATEST
        else:
            if queue_id is None or offset is None:
                raise ValueError("a reset of one queue needs both the queue and the offset")
            request.queue_offset.CopyFrom(opb.QueueOffset(queue_id=queue_id, offset=offset))
        answer = await self._call("ResetOffset", request, f"reset {group!r} on {topic!r}")
        return [QueueReset(q.queue_id, q.previous_offset, q.offset) for q in answer.queues]

    # --------------------------------------------------------------- plumbing
    async def _query(self, method: str, request: Any, what: str) -> Any:
        """Ask the servers in order: any node answers from its committed data."""
        last: ClientError | None = None
        for address in self.config.servers:
            stub = operations_pb2_grpc.OperationsServiceStub(self.connection.channel(address))
            try:
                answer = await getattr(stub, method)(request, metadata=self.connection.headers(),
                                                     timeout=self.config.request_timeout_s)
            except grpc.aio.AioRpcError as error:
                last = transport_error(error, address, what)
                continue
            check_status(answer.status, what)
            return answer
        assert last is not None
        raise last

    async def _call(self, method: str, request: Any, what: str) -> Any:
        connection = self.connection

        async def attempt(address: str) -> Any:
            stub = operations_pb2_grpc.OperationsServiceStub(connection.channel(address))
            answer = await getattr(stub, method)(request, metadata=connection.headers(),
                                                 timeout=self.config.request_timeout_s)
            check_status(answer.status, what)
            return answer

        return await connection.call(what, attempt)


def views_of(answer: opb.QueryMessagesResponse) -> list[MessageView]:
    return [view_of(m) for m in answer.messages]


def view_of(m: opb.MessageView) -> MessageView:
    delivery = None
    if m.HasField("delivery"):
        delivery = Delivery(m.delivery.group, STATE_NAMES.get(m.delivery.state, "unknown"), m.delivery.attempts,
                            m.delivery.lease_deadline_ms)
    return MessageView(m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.offset_message_id, m.message_id,
                       m.tag, list(m.keys), dict(m.properties), m.born_timestamp_ms, m.store_timestamp_ms,
                       m.born_host, m.store_host, m.reconsume_times, m.body, delivery)
