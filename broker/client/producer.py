"""Producer: send messages and get receipts (message id, queue id, offset).

    async with Producer("127.0.0.1:20911,127.0.0.1:20912") as producer:
        receipt = await producer.send(Message("Orders", b"..."))
        receipts = await producer.send_batch([Message("Orders", b"1"), Message("Orders", b"2")])
        future = producer.send_async(Message("Orders", b"3"))   # an asyncio.Future[SendReceipt]
        await producer.flush()

The producer names every message (a RocketMQ 5 client message id) before
its first attempt and keeps the name across retries, so a send whose answer
was lost (a killed leader, a commit that timed out) is retried safely: the
broker answers a repeated id with the original receipt. Concurrent sends
share calls (broker/client/accumulator.py); `coalesce=False` makes one call
per send. Transactions: `begin_transaction()` (broker/client/transaction.py).

Several broker groups (behind name servers): the producer looks the topic's
route up (cached, refreshed on a timer and after a failure) and, when the
topic lives in more than one group, sends each call to a group picked round
robin; a call that fails retriably is sent again to a *different* group
(lastBrokerName) and the failed group is avoided for a back-off window
(broker/client/groups.py). FIFO messages keep their message group on one
group (and the broker keeps it on one queue there), retried there only, so
their order holds; transactional messages stay with the group the producer's
Telemetry session reaches (which relays check-backs). A message retried on
another group after an unknown outcome may be stored in both: at least
once, as RocketMQ. With one group, nothing of this applies: the call goes to
the leader as always.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from typing import Any, Iterable, Sequence

from broker.client.accumulator import BatchOrder, PendingSend, SendAccumulator
from broker.client.base import BaseClient
from broker.client.config import ClientConfig
from broker.client.errors import (BadRequestError, ClientError, PayloadTooLargeError, PreconditionFailedError,
                                  check_status, error_for)
from broker.client.connection import Connection
from broker.client.groups import GroupConnections, fifo_group, pick_group, writable_groups
from broker.client.routes import Route, RouteCache
from broker.client.message import Message, SendReceipt, receipt_of, to_protocol
from broker.client.telemetry import CommandHandler
from broker.client.transaction import Transaction, TransactionChecker, check_back_handler
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.message_id import MessageIdGenerator

log = logging.getLogger(__name__)

# Coalescing limits: calls in flight, and what one call carries (the broker
# stores a call's messages as one replicated batch).
MAX_INFLIGHT_REQUESTS = 4
MAX_BATCH_MESSAGES = 1000
MAX_BATCH_BYTES = 4 << 20
DEFAULT_MAX_BODY_BYTES = 4 << 20
_NO_SETTINGS_READ = object()  # max_body_bytes has read no settings yet
# With several broker groups, a call is split over them only when each
# share would carry at least this many messages.
MIN_SHARE_MESSAGES = 16

_ids = MessageIdGenerator()


def check_body(body: bytes, max_body_bytes: int) -> None:
    """What the official clients check of a body before sending it."""
    if not body:
        raise BadRequestError(pb.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > max_body_bytes:
        raise PayloadTooLargeError(pb.MESSAGE_BODY_TOO_LARGE, f"the body is {len(body)} bytes; the "
                                                              f"broker takes at most {max_body_bytes}")


class Producer(BaseClient):
    client_type = pb.PRODUCER

    def __init__(self, servers: str | Iterable[str] | ClientConfig, topics: Iterable[str] = (), *,
                 checker: TransactionChecker | None = None, transaction_recovery_s: float | None = None,
                 coalesce: bool = True,
                 max_inflight_requests: int = MAX_INFLIGHT_REQUESTS, max_batch_messages: int = MAX_BATCH_MESSAGES,
                 max_batch_bytes: int = MAX_BATCH_BYTES, **config: Any) -> None:
        self.topics = list(dict.fromkeys(topics))
        self.checker = checker
        # How long an undecided transaction waits before the broker checks it
        # back (the protocol's orphaned_transaction_recovery_duration); None:
        # the broker's default (6 s).
        self.transaction_recovery_s = transaction_recovery_s
        super().__init__(servers, **config)
        self.coalesce = coalesce
        self.accumulator = SendAccumulator(self.send_call, max_inflight_requests, max_batch_messages,
                                           max_batch_bytes)
        self.max_batch_messages = max_batch_messages
        self._limit_settings: object = _NO_SETTINGS_READ
        self._max_body_bytes = DEFAULT_MAX_BODY_BYTES
        self.max_batch_bytes = max_batch_bytes
        self.routes = RouteCache(self.connection)
        self.groups = GroupConnections(self.config, self.connection.client_id)
        # Round robin over groups from a random start, as the official clients do.
        self._group_turn = itertools.count(random.randrange(1 << 16))

    # ----------------------------------------------------------- settings
    def settings(self) -> pb.Settings:
        settings = super().settings()
        settings.publishing.CopyFrom(pb.Publishing(topics=[self.connection.resource(t) for t in self.topics],
                                                   max_body_size=DEFAULT_MAX_BODY_BYTES,
                                                   validate_message_type=True))
        return settings

    def command_handler(self) -> CommandHandler | None:
        return check_back_handler(self) if self.checker is not None else None

    @property
    def max_body_bytes(self) -> int:
        server = self.telemetry.server_settings
        # Read once per settings message (telemetry replaces it when the
        # broker sends new ones): this runs for every message sent.
        if server is not self._limit_settings:
            self._limit_settings = server
            self._max_body_bytes = server.publishing.max_body_size \
                if server is not None and server.HasField("publishing") and server.publishing.max_body_size > 0 \
                else DEFAULT_MAX_BODY_BYTES
        return self._max_body_bytes

    async def close(self) -> None:
        if self.started:
            await self.accumulator.flush()
        await self.accumulator.close(PreconditionFailedError(pb.PRECONDITION_FAILED, "the producer was closed"))
        await super().close()
        await self.groups.close()

    # -------------------------------------------------------------- sends
    async def send(self, message: Message) -> SendReceipt:
        """Send one message; returns once it is committed by a majority."""
        return await self.send_async(message)

    def send_async(self, message: Message) -> asyncio.Future[SendReceipt]:
        """Start sending; the future completes with the receipt (or the error).
        Call from a running event loop."""
        pending = self._pending(message)
        if self.coalesce:
            self.accumulator.add([pending])
        else:
            asyncio.ensure_future(self._send_alone(pending))
        return pending.future

    def send_many(self, messages: Sequence[Message]) -> list[asyncio.Future[SendReceipt]]:
        """Start sending many messages (any topics) at once; a future per
        message, each completing with its receipt or its own error. Queued
        together, they leave in as few calls as the batch limits allow
        (send_async one by one would start a call for each of the first few)."""
        loop = asyncio.get_running_loop()
        sends = [self._pending(m, loop=loop) for m in messages]
        if self.coalesce:
            self.accumulator.add(sends)
        else:
            for pending in sends:
                asyncio.ensure_future(self._send_alone(pending))
        return [s.future for s in sends]

    async def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic together (in as few calls as the batch
        limits allow); raises the first failure after all are answered."""
        if not messages:
            return []
        if len({m.topic for m in messages}) != 1:
            raise BadRequestError(pb.BAD_REQUEST, "a batch goes to one topic; split it by topic")
        loop = asyncio.get_running_loop()  # once: each lookup costs a getpid()
        order = BatchOrder()   # stored in the order given (see broker/client/accumulator.py)
        sends = [self._pending(m, loop=loop, order=order) for m in messages]
        self.accumulator.add(sends)
        results = await asyncio.gather(*(s.future for s in sends), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)  # type: ignore[arg-type]

    async def flush(self) -> None:
        """Wait until every send started so far is answered."""
        await self.accumulator.flush()

    def begin_transaction(self) -> Transaction:
        self.require_started()
        return Transaction(self)

    # ------------------------------------------------------------ plumbing
    def _pending(self, message: Message, message_type: pb.MessageType | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, order: BatchOrder | None = None) -> PendingSend:
        self.require_started()
        self.check(message)
        wire = to_protocol(message, message.message_id or _ids.next_id(), self.config.namespace, message_type)
        future: asyncio.Future[SendReceipt] = (loop or asyncio.get_running_loop()).create_future()
        return PendingSend(message.topic, wire, len(message.body), message.message_group or order, future)

    def check(self, message: Message) -> None:
        """What the official clients check before sending; the broker checks the rest."""
        check_body(message.body, self.max_body_bytes)

    async def _send_alone(self, pending: PendingSend) -> None:
        try:
            result = (await self.send_call(pending.topic, [pending.message]))[0]
        except ClientError as error:
            result = error
        if pending.future.done():
            return
        if isinstance(result, ClientError):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)

    async def send_prepared(self, topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        """Messages of one topic already in their protocol form (a bulk writer
        that encodes them itself: spark/sink_rows.py), sent in as few calls as
        the batch limits allow, concurrently, without a future per message;
        each message's receipt or error, in order."""
        parts: list[list[pb.Message]] = [[]]
        size = 0
        for message in messages:
            part = parts[-1]
            if part and (len(part) == self.max_batch_messages or size + len(message.body) > self.max_batch_bytes):
                parts.append(part := [])
                size = 0
            part.append(message)
            size += len(message.body)
        answers = await asyncio.gather(*(self._outcomes(topic, part) for part in parts if part))
        return [outcome for answer in answers for outcome in answer]

    async def _outcomes(self, topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        try:
            return await self.send_call(topic, messages)
        except ClientError as error:   # the route lookup failed: every message shares it
            return [error] * len(messages)

    async def send_call(self, topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        """Send one call's messages: to the leader of the one group, or over
        the topic's groups (see the module docstring)."""
        route = await self._route(topic)
        groups = writable_groups(route.queues) if route is not None else []
        if len(groups) <= 1 or any(m.system_properties.message_type == pb.TRANSACTION for m in messages):
            return await self._send_with(self.connection, topic, messages)
        assert route is not None
        fifo: dict[str, list[pb.Message]] = {}
        free = []
        for message in messages:
            system = message.system_properties
            if system.HasField("message_group"):
                fifo.setdefault(fifo_group(groups, system.message_group), []).append(message)
            else:
                free.append(message)
        calls = [self._send_fifo(route, group, topic, part) for group, part in fifo.items()]
        # Round robin by call; a large call is split over the groups that are
        # not avoided (every group works on a burst), a small one is not (a
        # replicated batch costs about the same whatever it carries, so
        # halving small batches would only add calls).
        now = time.monotonic()
        usable = [g for g in groups if self.groups.faults.available(g, now)] or groups
        turn = next(self._group_turn)
        parts = max(1, min(len(usable), len(free) // MIN_SHARE_MESSAGES))
        shares = [free[i::parts] for i in range(parts)]
        calls += [self._send_across(route, groups, topic, share, usable[(turn + i) % len(usable)])
                  for i, share in enumerate(shares) if share]
        results: dict[str, SendReceipt | ClientError] = {}
        for part in await asyncio.gather(*calls):
            results.update(part)
        return [results[m.system_properties.message_id] for m in messages]

    async def _route(self, topic: str) -> Route | None:
        """The topic's route, or None when it cannot be had (the send then
        goes as with one group, and the broker says what is wrong)."""
        try:
            return await self.routes.route(topic, once=True)
        except ClientError as error:
            log.debug("no route for %r: %s", topic, error)
            return None

    def _queue_of(self, route: Route, group: str) -> pb.MessageQueue:
        return next(q for q in route.queues if q.broker.name == group)

    async def _send_across(self, route: Route, groups: list[str], topic: str, messages: list[pb.Message],
                           first: str) -> dict[str, SendReceipt | ClientError]:
        """Send to group `first`; what fails retriably goes to another group
        (round robin, skipping the one that failed and those avoided), the
        failed one avoided for a while, until the deadline."""
        faults = self.groups.faults
        deadline = time.monotonic() + self.config.deadline_s
        results: dict[str, SendReceipt | ClientError] = {}
        remaining, last_failed, group = list(messages), None, first
        while remaining:
            if last_failed is not None:
                group = pick_group(groups, next(self._group_turn), faults, time.monotonic(), last_failed)
            connection = self.groups.get(self._queue_of(route, group))
            outcome = await self._send_with(connection, topic, remaining, retry=lambda error: False)
            failed, retriable = [], False
            for message, result in zip(remaining, outcome):
                message_id = message.system_properties.message_id
                retriable = retriable or (isinstance(result, ClientError) and result.retriable)
                if isinstance(result, ClientError) and result.retriable and time.monotonic() < deadline:
                    failed.append(message)
                else:
                    results[message_id] = result
            if not retriable:
                faults.succeeded(group)
            if not failed:
                break
            window = faults.failed(group, time.monotonic())
            log.debug("send to group %s failed; it is avoided for %.1f s", group, window)
            self.connection.retries += 1
            remaining, last_failed = failed, group
            self.routes.invalidate(topic)
            if all(not faults.available(g, time.monotonic()) for g in groups):
                await asyncio.sleep(self.config.retry_initial_s)
        return results

    async def _send_fifo(self, route: Route, group: str, topic: str,
                         messages: list[pb.Message]) -> dict[str, SendReceipt | ClientError]:
        """A message group stays on its group (order): retried there only."""
        connection = self.groups.get(self._queue_of(route, group))
        outcome = await self._send_with(connection, topic, messages)
        return {m.system_properties.message_id: r for m, r in zip(messages, outcome)}

    async def _send_with(self, connection: Connection, topic: str, messages: list[pb.Message],
                         retry: Any = None) -> list[SendReceipt | ClientError]:
        """One SendMessage call, retried with the same message ids. Messages
        the broker failed retriably are sent again (only those); every message
        ends with its receipt or its error."""
        results: dict[str, SendReceipt | ClientError] = {}
        remaining = list(messages)

        async def attempt(address: str) -> None:
            nonlocal remaining
            request = spb.SendMessageRequest()
            request.messages.extend(remaining)  # copies, as the constructor would, in 60% of its time
            answer = await connection.unary(address, "SendMessage", request, spb.SendMessageResponse.FromString,
                                            self.config.request_timeout_s)
            if not answer.entries:
                check_status(answer.status, f"send to {topic!r}")
            retry, first_retriable = [], None
            entries = {entry.message_id: entry for entry in answer.entries}
            for message in remaining:
                message_id = message.system_properties.message_id
                entry = entries.get(message_id)
                if entry is None:
                    error: ClientError = error_for(pb.INTERNAL_SERVER_ERROR, f"the broker's answer lacks {message_id}")
                elif entry.status.code == pb.OK:
                    results[message_id] = receipt_of(entry, topic, connection.broker_name)
                    continue
                else:
                    error = error_for(entry.status.code, f"send to {topic!r}: {entry.status.message}")
                if error.retriable:
                    retry.append(message)
                    first_retriable = first_retriable or error
                else:
                    results[message_id] = error
            remaining = retry
            if first_retriable is not None:
                raise first_retriable

        try:
            await connection.call(f"send to {topic!r}", attempt, retry)
        except ClientError as error:
            for message in remaining:
                results.setdefault(message.system_properties.message_id, error)
        return [results[m.system_properties.message_id] for m in messages]
