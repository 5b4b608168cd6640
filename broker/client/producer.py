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
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable, Sequence

from broker.client.accumulator import PendingSend, SendAccumulator
from broker.client.base import BaseClient
from broker.client.config import ClientConfig
from broker.client.errors import (BadRequestError, ClientError, PayloadTooLargeError, PreconditionFailedError,
                                  check_status, error_for)
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

_ids = MessageIdGenerator()


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
        self.max_batch_bytes = max_batch_bytes

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
        if server is not None and server.HasField("publishing") and server.publishing.max_body_size > 0:
            return server.publishing.max_body_size
        return DEFAULT_MAX_BODY_BYTES

    async def close(self) -> None:
        if self.started:
            await self.accumulator.flush()
        await self.accumulator.close(PreconditionFailedError(pb.PRECONDITION_FAILED, "the producer was closed"))
        await super().close()

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

    async def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic together (in as few calls as the batch
        limits allow); raises the first failure after all are answered."""
        if not messages:
            return []
        if len({m.topic for m in messages}) != 1:
            raise BadRequestError(pb.BAD_REQUEST, "a batch goes to one topic; split it by topic")
        loop = asyncio.get_running_loop()  # once: each lookup costs a getpid()
        sends = [self._pending(m, loop=loop) for m in messages]
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
                 loop: asyncio.AbstractEventLoop | None = None) -> PendingSend:
        self.require_started()
        self.check(message)
        wire = to_protocol(message, message.message_id or _ids.next_id(), self.config.namespace, message_type)
        future: asyncio.Future[SendReceipt] = (loop or asyncio.get_running_loop()).create_future()
        return PendingSend(message.topic, wire, len(message.body), message.message_group, future)

    def check(self, message: Message) -> None:
        """What the official clients check before sending; the broker checks the rest."""
        if not message.body:
            raise BadRequestError(pb.MESSAGE_BODY_EMPTY, "the message body is empty")
        if len(message.body) > self.max_body_bytes:
            raise PayloadTooLargeError(pb.MESSAGE_BODY_TOO_LARGE, f"the body is {len(message.body)} bytes; the "
                                                                  f"broker takes at most {self.max_body_bytes}")

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

    async def send_call(self, topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        """One SendMessage call, retried with the same message ids. Messages
        the broker failed retriably are sent again (only those); every message
        ends with its receipt or its error."""
        connection = self.connection
        results: dict[str, SendReceipt | ClientError] = {}
        remaining = list(messages)

        async def attempt(address: str) -> None:
            nonlocal remaining
            answer = await connection.messaging(address).SendMessage(
                spb.SendMessageRequest(messages=remaining), metadata=connection.headers(),
                timeout=self.config.request_timeout_s)
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
                    results[message_id] = receipt_of(entry, topic)
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
            await connection.call(f"send to {topic!r}", attempt)
        except ClientError as error:
            for message in remaining:
                results.setdefault(message.system_properties.message_id, error)
        return [results[m.system_properties.message_id] for m in messages]
