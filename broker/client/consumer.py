"""SimpleConsumer: pop-style consumption (receive, ack, change invisible duration).

    async with SimpleConsumer(servers, "OrderGroup", {"Orders": "*"}) as consumer:
        for message in await consumer.receive(32, invisible_duration=30):
            ...
            await consumer.ack(message)

A received message is invisible to the group for its invisible duration; if
it is not acknowledged by then, the broker delivers it again (delivery_attempt
+ 1), and after the group's max attempts moves it to %DLQ%<group>. Acks are
batched: `ack(*messages)` sends one AckMessage call per topic and up to
`max_ack_entries` entries, and concurrent ack() calls share calls, so a
consumer acks tens of thousands of messages a second.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import grpc

from broker.client.base import BaseClient
from broker.client.connection import Connection
from broker.client.groups import GroupConnections
from broker.client.config import ClientConfig
from broker.client.errors import BadRequestError, ClientError, check_status, error_for
from broker.client.message import ReceivedMessage, duration, from_protocol
from broker.client.routes import RouteCache
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

log = logging.getLogger(__name__)

DEFAULT_AWAIT_S = 20.0            # long polling (the official clients' await duration)
DEFAULT_INVISIBLE_S = 60.0        # RocketMQ 5's default invisible duration
MAX_ACK_ENTRIES = 1000
MAX_INFLIGHT_ACKS = 4


class AckError(ClientError):
    """Some messages of an ack were not acknowledged; `failures` maps their
    message ids to why (an expired receipt handle: INVALID_RECEIPT_HANDLE)."""

    def __init__(self, failures: dict[str, ClientError]) -> None:
        first = next(iter(failures.values()))
        super().__init__(first.code, f"{len(failures)} message(s) not acknowledged; first: {first.message}")
        self.failures = failures


def subscriptions_of(subscriptions: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    """{topic: tag expression}; a bare topic list subscribes to every tag."""
    if isinstance(subscriptions, Mapping):
        return {topic: expression or "*" for topic, expression in subscriptions.items()}
    return {topic: "*" for topic in subscriptions}


class SimpleConsumer(BaseClient):
    client_type = pb.SIMPLE_CONSUMER

    def __init__(self, servers: str | Iterable[str] | ClientConfig, group: str,
                 subscriptions: Mapping[str, str] | Iterable[str] = (), *, await_duration_s: float = DEFAULT_AWAIT_S,
                 max_ack_entries: int = MAX_ACK_ENTRIES, **config: Any) -> None:
        self.consumer_group = group
        self.subscriptions = subscriptions_of(subscriptions)
        self.await_duration_s = await_duration_s
        super().__init__(servers, **config)
        self.routes = RouteCache(self.connection)
        self._topic_turn = itertools.count()
        self._queue_turn = itertools.count()
        self.acks = _AckBatcher(self, max_ack_entries)
        # Several broker groups: a connection per group, each told of the
        # consumer group once (its Heartbeat creates it there).
        self.groups = GroupConnections(self.config, self.connection.client_id)
        self._greeted: set[str] = set()
        # Several groups: the long polls under way per (topic, group), the
        # receives waiting for them, and what finished polls brought that no
        # receive has handed out yet.
        self._polls: dict[tuple[str, str], set[asyncio.Task[list[ReceivedMessage]]]] = {}
        self._receiving = 0
        self._arrived: deque[ReceivedMessage] = deque()

    def settings(self) -> pb.Settings:
        settings = super().settings()
        settings.subscription.CopyFrom(pb.Subscription(
            group=self.connection.resource(self.consumer_group),
            subscriptions=[pb.SubscriptionEntry(topic=self.connection.resource(topic),
                                                expression=pb.FilterExpression(type=pb.TAG, expression=expression))
                           for topic, expression in self.subscriptions.items()],
            long_polling_timeout=duration(self.await_duration_s)))
        return settings

    def group(self) -> str | None:
        return self.consumer_group

    async def subscribe(self, topic: str, expression: str = "*") -> None:
        self.subscriptions[topic] = expression or "*"
        await self.telemetry.resync()

    async def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        await self.telemetry.resync()

    async def close(self) -> None:
        # Messages a cancelled poll had leased come back after their lease.
        polls = [task for tasks in self._polls.values() for task in tasks]
        for task in polls:
            task.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        self._polls.clear()
        await self.acks.close()
        await super().close()
        await self.groups.close()

    async def _connection_for(self, queue: pb.MessageQueue, several_groups: bool) -> Connection:
        """The configured servers' connection with one group; the queue's
        group's own with several."""
        if not several_groups:
            return self.connection
        connection = self.groups.get(queue)
        if connection.broker_name not in self._greeted:
            await self.heartbeat_on(connection, lambda error: False)   # one attempt: see receive()
            self._greeted.add(connection.broker_name)
        return connection

    def _ack_connection(self, broker_name: str) -> Connection:
        return (self.groups.by_name(broker_name) if broker_name else None) or self.connection

    # ------------------------------------------------------------ receive
    async def receive(self, max_messages: int = 32, invisible_duration: float | timedelta = DEFAULT_INVISIBLE_S,
                      await_duration_s: float | None = None) -> list[ReceivedMessage]:
        """Up to `max_messages` (1..128: the batch comes in one response) from
        one of the subscribed topics, waiting (long polling) up to
        `await_duration_s` for any to arrive; [] if none."""
        self.require_started()
        if not self.subscriptions:
            raise BadRequestError(pb.BAD_REQUEST, "the consumer subscribes to no topic")
        topics = list(self.subscriptions)
        topic = topics[next(self._topic_turn) % len(topics)]
        # Once a route is known, a failed refresh keeps it rather than holding
        # the receive up (a group's leader may just have died).
        route = await self.routes.route(topic, once=self.routes.known(topic))
        queues = route.readable
        if not queues:
            raise BadRequestError(pb.FORBIDDEN, f"topic {topic!r} has no readable queue")
        several_groups = len({q.broker.name for q in queues}) > 1
        if several_groups:
            # A group that just failed is left alone for its back-off window.
            now = time.monotonic()
            queues = [q for q in queues if self.groups.faults.available(q.broker.name, now)] or queues
        polling = self.await_duration_s if await_duration_s is None else await_duration_s
        if several_groups:
            return await self._receive_from_groups(topic, queues, max_messages, invisible_duration, polling)
        queue = queues[next(self._queue_turn) % len(queues)]
        request = self._receive_request(topic, queue, max_messages, invisible_duration, polling)
        return await self.connection.call(f"receive from {topic!r}",
                                          lambda address: self._receive_once(self.connection, address, request,
                                                                             polling), long_poll=True)

    def _receive_request(self, topic: str, queue: pb.MessageQueue, max_messages: int,
                         invisible_duration: float | timedelta, polling: float) -> spb.ReceiveMessageRequest:
        return spb.ReceiveMessageRequest(
            group=self.connection.resource(self.consumer_group), message_queue=queue,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=self.subscriptions[topic]),
            batch_size=max_messages, invisible_duration=duration(invisible_duration), auto_renew=False,
            long_polling_timeout=duration(polling),
            # The same id on a retry lets the broker hand back the same batch.
            attempt_id=uuid.uuid4().hex,
            # Our extension: the batch comes in one response, not one per message.
            batched_response=True)

    async def _receive_from_groups(self, topic: str, queues: list[pb.MessageQueue], max_messages: int,
                                   invisible_duration: float | timedelta, polling: float) -> list[ReceivedMessage]:
        """Several groups: long polls on a queue of every group at once, so
        that a group with nothing to deliver does not hold up one that has
        (a single poll waits at least the broker's minimum of 5 s). Every
        receive waiting keeps a poll going at every group, so concurrent
        receives keep as many polls in flight at each group as at a single
        one. The first poll to answer ends a receive; the others go on, and
        what they bring is handed out by the next receives, before any new poll."""
        by_group: dict[str, list[pb.MessageQueue]] = {}
        for queue in queues:
            by_group.setdefault(queue.broker.name, []).append(queue)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + polling
        self._receiving += 1
        try:
            self._collect_polls()
            while not self._arrived and loop.time() < give_up:
                for name, group_queues in by_group.items():
                    polls = self._polls.setdefault((topic, name), set())
                    if len(polls) < self._receiving:
                        queue = group_queues[next(self._queue_turn) % len(group_queues)]
                        request = self._receive_request(topic, queue, max_messages, invisible_duration, polling)
                        polls.add(asyncio.create_task(self._poll_group(topic, queue, request, polling)))
                running = [task for (polled, _), polls in self._polls.items() if polled == topic for task in polls]
                done, _ = await asyncio.wait(running, timeout=give_up - loop.time(),
                                             return_when=asyncio.FIRST_COMPLETED)
                self._collect_polls()
                if not done:
                    break
        finally:
            self._receiving -= 1
        return [self._arrived.popleft() for _ in range(min(max_messages, len(self._arrived)))]

    def _collect_polls(self) -> None:
        """Move what finished polls brought into the hand-out queue; a poll's
        error that is not retriable is raised (after the others are kept)."""
        failure: BaseException | None = None
        for polls in self._polls.values():
            for task in [task for task in polls if task.done()]:
                polls.discard(task)
                if task.cancelled():
                    continue
                error = task.exception()
                if error is None:
                    self._arrived.extend(task.result())
                elif failure is None:
                    failure = error
        if failure is not None:
            raise failure

    async def _poll_group(self, topic: str, queue: pb.MessageQueue, request: spb.ReceiveMessageRequest,
                          polling: float) -> list[ReceivedMessage]:
        # One attempt: a group that fails is left alone for its back-off
        # window and its poll brings nothing, rather than waiting out the
        # deadline on a group that lost its leader.
        try:
            connection = await self._connection_for(queue, True)
            received = await connection.call(f"receive from {topic!r}",
                                             lambda address: self._receive_once(connection, address, request,
                                                                                polling), lambda error: False,
                                             long_poll=True)
        except ClientError as error:
            if not error.retriable:
                raise
            window = self.groups.faults.failed(queue.broker.name, time.monotonic())
            self.routes.invalidate(topic)
            log.info("receive from group %s failed (%s); it is avoided for %.1f s", queue.broker.name, error,
                     window)
            return []
        self.groups.faults.succeeded(queue.broker.name)
        for message in received:
            message.broker_name = queue.broker.name
        return received

    async def _receive_once(self, connection: Connection, address: str, request: spb.ReceiveMessageRequest,
                            polling: float) -> list[ReceivedMessage]:
        timeout = polling + self.config.request_timeout_s
        messages: list[ReceivedMessage] = []
        status: pb.Status | None = None

        def take(response: spb.ReceiveMessageResponse) -> None:
            nonlocal status
            content = response.WhichOneof("content")
            if content == "message":
                messages.append(from_protocol(response.message))
            elif content == "status":
                status = response.status
                messages.extend(from_protocol(message) for message in response.messages)

        on_link = await connection.stream_on_link(address, "ReceiveMessage", request,
                                                  spb.ReceiveMessageResponse.FromString, timeout)
        if on_link is not None:
            for response in on_link:
                take(response)
            return self._received(messages, status)
        call = connection.messaging(address).ReceiveMessage(request, metadata=connection.headers(), timeout=timeout)
        try:
            async for response in call:
                take(response)
        except grpc.aio.AioRpcError as error:
            if messages:
                # The stream broke after messages arrived: keep them (they are
                # leased to us; an unacked one comes back after its lease).
                log.debug("receive stream broke after %d messages: %s", len(messages), error)
                return messages
            raise
        return self._received(messages, status)

    @staticmethod
    def _received(messages: list[ReceivedMessage], status: pb.Status | None) -> list[ReceivedMessage]:
        if status is not None and status.code not in (pb.OK, pb.MESSAGE_NOT_FOUND) and not messages:
            check_status(status, "receive")
        return messages

    async def messages(self, batch: int = 32, invisible_duration: float | timedelta = DEFAULT_INVISIBLE_S
                       ) -> AsyncIterator[ReceivedMessage]:
        """Received messages, one by one, for ever (the caller acks them)."""
        while True:
            for message in await self.receive(batch, invisible_duration):
                yield message

    # ----------------------------------------------------------------- ack
    async def ack(self, *messages: ReceivedMessage) -> None:
        """Acknowledge messages (in as few calls as possible); raises AckError
        naming those the broker refused."""
        self.require_started()
        if not messages:
            return
        failures = await self.acks.add(messages)
        if failures:
            raise AckError(failures)

    async def change_invisible_duration(self, message: ReceivedMessage,
                                        invisible_duration: float | timedelta) -> ReceivedMessage:
        """Extend (or shorten: 0 is "deliver again now") a message's lease; the
        message's receipt handle is replaced by the new one."""
        self.require_started()
        connection = self._ack_connection(message.broker_name)
        request = spb.ChangeInvisibleDurationRequest(
            group=connection.resource(self.consumer_group), topic=connection.resource(message.topic),
            receipt_handle=message.receipt_handle, invisible_duration=duration(invisible_duration),
            message_id=message.message_id)

        async def attempt(address: str) -> str:
            answer = await connection.unary(address, "ChangeInvisibleDuration", request,
                                            spb.ChangeInvisibleDurationResponse.FromString,
                                            self.config.request_timeout_s)
            check_status(answer.status, f"change invisible duration of {message.message_id}")
            return answer.receipt_handle

        handle = await connection.call("ChangeInvisibleDuration", attempt)
        if handle:
            message.receipt_handle = handle
        message.invisible_duration = (invisible_duration if isinstance(invisible_duration, timedelta)
                                      else timedelta(seconds=invisible_duration))
        return message

    async def ack_call(self, topic: str, entries: list[spb.AckMessageEntry],
                       broker_name: str = "") -> dict[str, ClientError | None]:
        """One AckMessage call (retried for retriable failures) to the group
        the messages came from; the outcome per receipt handle: None for
        acknowledged, else the error."""
        connection = self._ack_connection(broker_name)
        outcome: dict[str, ClientError | None] = {}
        remaining = list(entries)

        async def attempt(address: str) -> None:
            nonlocal remaining
            answer = await connection.unary(
                address, "AckMessage", spb.AckMessageRequest(group=connection.resource(self.consumer_group),
                                                             topic=connection.resource(topic), entries=remaining),
                spb.AckMessageResponse.FromString, self.config.request_timeout_s)
            if not answer.entries or answer.status.code == pb.OK:
                # OK overall: the broker says so only when every entry is.
                check_status(answer.status, f"ack on {topic!r}")
                outcome.update((e.receipt_handle, None) for e in remaining)
                remaining = []
                return
            by_handle = {e.receipt_handle: e for e in answer.entries}
            retry, first_retriable = [], None
            for entry in remaining:
                result = by_handle.get(entry.receipt_handle)
                code = result.status.code if result is not None else answer.status.code
                if code == pb.OK:
                    outcome[entry.receipt_handle] = None
                    continue
                message = result.status.message if result is not None else answer.status.message
                error = error_for(code, f"ack of {entry.message_id}: {message}")
                if error.retriable:
                    retry.append(entry)
                    first_retriable = first_retriable or error
                else:
                    outcome[entry.receipt_handle] = error
            remaining = retry
            if first_retriable is not None:
                raise first_retriable

        try:
            await connection.call(f"ack on {topic!r}", attempt)
        except ClientError as error:
            for entry in remaining:
                outcome.setdefault(entry.receipt_handle, error)
        return outcome


@dataclass
class _PendingAck:
    topic: str
    broker_name: str
    entry: spb.AckMessageEntry
    call: _AckCall = field(repr=False)


class _AckCall:
    """One ack() call's messages: it is answered once every one of them is,
    with the failures by message id (one future per call, not per message:
    a consumer acks tens of thousands of messages a second)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.future: asyncio.Future[dict[str, ClientError]] = loop.create_future()
        self.remaining = count
        self.failures: dict[str, ClientError] = {}

    def settle(self, message_id: str, error: ClientError | None) -> None:
        if error is not None:
            self.failures[message_id] = error
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.failures)


class _AckBatcher:
    """Concurrent acks leave together (per topic, up to `max_entries` per
    call, `MAX_INFLIGHT_ACKS` calls in flight), as sends do: acks made in one
    event-loop turn leave together at its end (without that, the first acks
    of a turn took a call each while calls were free)."""

    def __init__(self, consumer: SimpleConsumer, max_entries: int) -> None:
        self.consumer = consumer
        self.max_entries = max_entries
        self._queue: deque[_PendingAck] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._linger: asyncio.Handle | None = None

    def add(self, messages: Sequence[ReceivedMessage]) -> asyncio.Future[dict[str, ClientError]]:
        """Queue `messages`' acks; the future is the failures by message id
        once every one is answered ({} when all were acknowledged)."""
        loop = asyncio.get_running_loop()
        call = _AckCall(loop, len(messages))
        entry = spb.AckMessageEntry
        self._queue.extend(_PendingAck(m.topic, m.broker_name,
                                       entry(message_id=m.message_id, receipt_handle=m.receipt_handle), call)
                           for m in messages)
        if len(self._queue) >= self.max_entries:
            self._drain()
        elif self._linger is None:
            self._linger = loop.call_soon(self._linger_over)
        return call.future

    def _linger_over(self) -> None:
        self._linger = None
        self._drain()

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closed = ClientError(pb.PRECONDITION_FAILED, "the consumer was closed before the ack was sent")
        while self._queue:
            pending = self._queue.popleft()
            pending.call.settle(pending.entry.message_id, closed)

    def _drain(self) -> None:
        while self._queue and self._inflight < MAX_INFLIGHT_ACKS:
            # One call per topic and broker group (an ack goes to the group
            # the message came from).
            topic, broker_name = self._queue[0].topic, self._queue[0].broker_name
            batch: list[_PendingAck] = []
            kept: deque[_PendingAck] = deque()
            while self._queue and len(batch) < self.max_entries:
                pending = self._queue.popleft()
                same = pending.topic == topic and pending.broker_name == broker_name
                (batch if same else kept).append(pending)
            kept.extend(self._queue)
            self._queue = kept
            self._inflight += 1
            task = asyncio.ensure_future(self._send(topic, broker_name, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, topic: str, broker_name: str, batch: list[_PendingAck]) -> None:
        try:
            try:
                outcome = await self.consumer.ack_call(topic, [p.entry for p in batch], broker_name)
            except Exception as error:  # noqa: BLE001 - every waiting ack gets it
                failure = error if isinstance(error, ClientError) else ClientError(pb.INTERNAL_ERROR, str(error))
                outcome = {p.entry.receipt_handle: failure for p in batch}
            for pending in batch:
                pending.call.settle(pending.entry.message_id, outcome.get(pending.entry.receipt_handle))
        finally:
            self._inflight -= 1
            self._drain()

