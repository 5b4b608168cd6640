"""Transactions: half messages that become visible on commit.

    async with producer.begin_transaction() as transaction:
        await transaction.send(Message("Orders", b"..."))
        ... the local transaction ...
    # committed on a clean exit, rolled back on an exception

or `await transaction.commit()` / `rollback()` explicitly. A transaction may
hold several messages; each is a half message with its own transaction id,
and commit/rollback ends each (EndTransaction, source CLIENT).

When the producer dies before deciding, the broker checks back after a while
with a producer of the topic over Telemetry (RecoverOrphanedTransactionCommand);
the `checker` given to the Producer answers COMMIT, ROLLBACK or UNKNOWN (ask
again later), and the producer ends the transaction with source SERVER_CHECK.
"""
from __future__ import annotations

import enum
import inspect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from broker.client.errors import BadRequestError, PreconditionFailedError, check_status
from broker.client.message import Message, ReceivedMessage, SendReceipt, duration, from_protocol
from broker.client.telemetry import CommandHandler
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

if TYPE_CHECKING:
    from broker.client.producer import Producer

log = logging.getLogger(__name__)


class TransactionResolution(enum.IntEnum):
    UNKNOWN = pb.TRANSACTION_RESOLUTION_UNSPECIFIED  # undecided: the broker asks again later
    COMMIT = pb.COMMIT
    ROLLBACK = pb.ROLLBACK


# The application's answer to a check-back, sync or async.
TransactionChecker = Callable[[ReceivedMessage], "TransactionResolution | Awaitable[TransactionResolution]"]


_RESOLUTIONS: dict[TransactionResolution, pb.TransactionResolution] = {
    TransactionResolution.UNKNOWN: pb.TRANSACTION_RESOLUTION_UNSPECIFIED,
    TransactionResolution.COMMIT: pb.COMMIT, TransactionResolution.ROLLBACK: pb.ROLLBACK}


@dataclass(frozen=True)
class HalfMessage:
    topic: str
    message_id: str
    transaction_id: str


class Transaction:
    def __init__(self, producer: "Producer") -> None:
        self.producer = producer
        self.messages: list[HalfMessage] = []
        self.resolution: TransactionResolution | None = None

    async def send(self, message: Message) -> SendReceipt:
        """Store `message` as a half message: invisible until commit."""
        if self.resolution is not None:
            raise PreconditionFailedError(pb.PRECONDITION_FAILED,
                                          f"the transaction is already {self.resolution.name.lower()}ed")
        if message.message_group is not None or message.delivery_time is not None or message.delay is not None:
            raise BadRequestError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                  "a transactional message cannot be FIFO or delayed")
        producer = self.producer
        if message.topic not in producer.topics:
            # The broker checks back with producers that publish the topic.
            producer.topics.append(message.topic)
            await producer.telemetry.resync()
        pending = producer._pending(message, pb.TRANSACTION)
        if producer.transaction_recovery_s is not None:
            pending.message.system_properties.orphaned_transaction_recovery_duration.CopyFrom(
                duration(producer.transaction_recovery_s))
        result = (await producer.send_call(message.topic, [pending.message]))[0]
        if isinstance(result, Exception):
            raise result
        self.messages.append(HalfMessage(message.topic, result.message_id, result.transaction_id))
        return result

    async def commit(self) -> None:
        await self._end(TransactionResolution.COMMIT)

    async def rollback(self) -> None:
        await self._end(TransactionResolution.ROLLBACK)

    async def _end(self, resolution: TransactionResolution) -> None:
        if self.resolution is not None:
            if self.resolution == resolution:
                return
            raise PreconditionFailedError(pb.PRECONDITION_FAILED,
                                          f"the transaction is already {self.resolution.name.lower()}ed")
        for half in self.messages:
            await end_transaction(self.producer, half, resolution, pb.SOURCE_CLIENT)
        self.resolution = resolution

    async def __aenter__(self) -> "Transaction":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.resolution is None:
            await (self.rollback() if exc_type is not None else self.commit())


async def end_transaction(producer: "Producer", half: HalfMessage, resolution: TransactionResolution,
                          source: pb.TransactionSource) -> None:
    connection = producer.connection
    request = spb.EndTransactionRequest(topic=connection.resource(half.topic), message_id=half.message_id,
                                        transaction_id=half.transaction_id, resolution=_RESOLUTIONS[resolution],
                                        source=source)

    async def attempt(address: str) -> None:
        answer = await connection.messaging(address).EndTransaction(
            request, metadata=connection.headers(), timeout=producer.config.request_timeout_s)
        check_status(answer.status, f"end transaction of {half.message_id}")

    await connection.call("EndTransaction", attempt)


def check_back_handler(producer: "Producer") -> CommandHandler:
    """Answers the broker's RecoverOrphanedTransactionCommand with the checker's verdict."""
    async def handle(command: spb.TelemetryCommand) -> spb.TelemetryCommand | None:
        if not command.HasField("recover_orphaned_transaction_command") or producer.checker is None:
            return None
        recover = command.recover_orphaned_transaction_command
        message = from_protocol(recover.message)
        message.transaction_id = recover.transaction_id
        verdict = producer.checker(message)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        resolution = TransactionResolution(verdict)
        log.info("transaction check-back of %s: %s", message.message_id, resolution.name)
        if resolution != TransactionResolution.UNKNOWN:
            half = HalfMessage(message.topic, message.message_id, recover.transaction_id)
            await end_transaction(producer, half, resolution, pb.SOURCE_SERVER_CHECK)
        return None
    return handle
