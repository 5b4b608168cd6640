"""pydledger's own asyncio client for the RocketMQ 5 protocol (broker.client).

    from broker.client import Message, Producer, SimpleConsumer, PullConsumer, AdminClient

Modules: producer.py (Producer, send/batch/async), accumulator.py (sends
sharing calls), transaction.py (Transaction, checker), consumer.py
(SimpleConsumer: receive/ack/change invisible duration), pull.py
(PullConsumer: offsets), admin.py (AdminClient), operations.py
(OperationsClient: message query, progress, offset reset, resend), message.py (Message,
SendReceipt, ReceivedMessage), errors.py (typed exceptions with the protocol's
codes), connection.py (leader, headers, retries), telemetry.py (the settings
and command stream), routes.py (QueryRoute cache), base.py (lifecycle).
"""
from broker.client.admin import AdminClient, GroupInfo, QueueLag, TopicInfo
from broker.client.config import ClientConfig
from broker.client.consumer import AckError, SimpleConsumer
from broker.client.errors import (BadRequestError, ClientError, ForbiddenError, InternalServerError, NotFoundError,
                                  OutcomeUnknownError, PayloadTooLargeError, PreconditionFailedError,
                                  RequestTimeoutError, TooManyRequestsError, UnavailableError, UnsupportedError)
from broker.client.message import Message, ReceivedMessage, SendReceipt
from broker.client.operations import OperationsClient
from broker.client.producer import Producer
from broker.client.pull import OffsetPolicy, PullConsumer, PullResult
from broker.client.transaction import Transaction, TransactionChecker, TransactionResolution

__all__ = [
    "AckError", "AdminClient", "BadRequestError", "ClientConfig", "ClientError", "ForbiddenError", "GroupInfo",
    "InternalServerError", "Message", "NotFoundError", "OffsetPolicy", "OperationsClient", "OutcomeUnknownError",
    "PayloadTooLargeError", "PreconditionFailedError", "Producer", "PullConsumer", "PullResult", "QueueLag",
    "ReceivedMessage", "RequestTimeoutError", "SendReceipt", "SimpleConsumer", "TooManyRequestsError", "TopicInfo",
    "Transaction", "TransactionChecker", "TransactionResolution", "UnavailableError", "UnsupportedError",
]
