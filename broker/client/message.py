"""What an application sends and receives, and their protocol forms.

`Message` is what a producer sends; `SendReceipt` what it gets back (message
id, queue id, queue offset); `ReceivedMessage` what a consumer gets (with
the receipt handle a SimpleConsumer acks with, or the offset a PullConsumer
resumes from).
"""
from __future__ import annotations

import functools
import gzip
import socket
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Mapping, Sequence

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

MESSAGE_TYPES = {pb.NORMAL: "NORMAL", pb.FIFO: "FIFO", pb.DELAY: "DELAY", pb.TRANSACTION: "TRANSACTION"}
try:
    BORN_HOST = socket.gethostbyname(socket.gethostname())
except OSError:
    BORN_HOST = "127.0.0.1"


@dataclass
class Message:
    """A message to send. `message_group` makes it FIFO (ordered within the
    group); `delivery_time` (or `delay`, seconds or a timedelta from the send)
    makes it a delayed message."""
    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str | None = None
    delivery_time: datetime | None = None
    delay: float | timedelta | None = None
    # The RocketMQ 5 message id ("01" + 32 hex digits); None: the producer
    # makes one. A caller that may send the same message again (a retried
    # Spark task, spark/sink.py) names it, so the broker dedupes the repeat.
    message_id: str | None = None

    @property
    def message_type(self) -> pb.MessageType:
        if self.message_group is not None:
            return pb.FIFO
        if self.delivery_time is not None or self.delay is not None:
            return pb.DELAY
        return pb.NORMAL


@dataclass(frozen=True)
class SendReceipt:
    message_id: str
    topic: str
    queue_id: int
    offset: int
    transaction_id: str = ""
    recall_handle: str = ""
    # The broker group that stored it (with several groups behind name servers).
    broker_name: str = ""


@dataclass
class ReceivedMessage:
    topic: str
    message_id: str
    body: bytes
    tag: str | None
    keys: list[str]
    properties: dict[str, str]
    message_group: str | None
    message_type: str
    queue_id: int
    queue_offset: int
    delivery_attempt: int
    receipt_handle: str
    born_host: str
    # Times as seconds since the epoch; the datetimes below are made from
    # them when asked for (making three per message received cost a consumer
    # more than a tenth of its CPU, and most never look).
    born_epoch_s: float
    store_epoch_s: float | None
    delivery_epoch_s: float | None
    invisible_duration: timedelta | None
    # The body did not match the broker's digest (it is delivered anyway, as
    # the official clients do, so that the application decides).
    corrupted: bool = False
    # For a dead-lettered message: where it came from.
    dead_letter_topic: str | None = None
    # The broker group it came from: its acks go there (several groups).
    broker_name: str = ""
    # The transaction id of a half message a check-back asks about.
    transaction_id: str = ""

    @property
    def born_timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.born_epoch_s, _UTC)

    @property
    def store_timestamp(self) -> datetime | None:
        return _datetime(self.store_epoch_s)

    @property
    def delivery_timestamp(self) -> datetime | None:
        return _datetime(self.delivery_epoch_s)


# ---------------------------------------------------------------- to the wire

def to_protocol(message: Message, message_id: str, namespace: str = "",
                message_type: pb.MessageType | None = None, now: float | None = None) -> pb.Message:
    now = time.time() if now is None else now
    # Built in place: submessages passed to a constructor are copied (this
    # runs for every message sent).
    wire = pb.Message(body=message.body)
    if message.properties:
        wire.user_properties.update(message.properties)
    topic = wire.topic
    topic.name = message.topic
    if namespace:
        topic.resource_namespace = namespace
    system = wire.system_properties
    system.message_id = message_id
    system.body_encoding = pb.IDENTITY
    system.message_type = message_type or message.message_type
    _set_timestamp(system.born_timestamp, now)
    system.born_host = BORN_HOST
    if message.tag is not None:
        system.tag = message.tag
    if message.keys:
        system.keys.extend(message.keys)
    if message.message_group is not None:
        system.message_group = message.message_group
    delivery = delivery_epoch(message, now)
    if delivery is not None:
        _set_timestamp(system.delivery_timestamp, delivery)
    return wire


def delivery_epoch(message: Message, now: float) -> float | None:
    if message.delivery_time is not None:
        when = message.delivery_time
        if when.tzinfo is None:
            when = when.astimezone()  # a naive datetime is local time, as datetime.timestamp() reads it
        return when.timestamp()
    if message.delay is not None:
        seconds = message.delay.total_seconds() if isinstance(message.delay, timedelta) else float(message.delay)
        return now + seconds
    return None


def receipt_of(entry: spb.SendResultEntry, topic: str, broker_name: str = "") -> SendReceipt:
    return SendReceipt(message_id=entry.message_id, topic=topic, queue_id=entry.queue_id, offset=entry.offset,
                       transaction_id=entry.transaction_id, recall_handle=entry.recall_handle,
                       broker_name=broker_name)


def duration(seconds: float | timedelta) -> Duration:
    value = Duration()
    value.FromTimedelta(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))
    return value


def _set_timestamp(field: Timestamp, epoch: float) -> None:
    seconds = int(epoch)
    field.seconds = seconds
    field.nanos = int((epoch - seconds) * 1e9)


# -------------------------------------------------------------- from the wire

def from_protocol(message: pb.Message) -> ReceivedMessage:
    # Runs once per message received: the protobuf getters are C calls, but a
    # dict() or list() of an empty container still walks it, so empty ones
    # are skipped (most messages carry no keys and no user properties).
    system = message.system_properties
    body, corrupted = _decoded_body(message.body, system)
    has = system.HasField
    user_properties = message.user_properties
    keys = system.keys
    return ReceivedMessage(
        topic=message.topic.name, message_id=system.message_id, body=body,
        tag=system.tag if has("tag") else None, keys=list(keys) if keys else [],
        properties=dict(user_properties) if user_properties else {},
        message_group=system.message_group if has("message_group") else None,
        message_type=MESSAGE_TYPES.get(system.message_type, "NORMAL"),
        queue_id=system.queue_id, queue_offset=system.queue_offset,
        delivery_attempt=system.delivery_attempt if has("delivery_attempt") else 1,
        receipt_handle=system.receipt_handle, born_host=system.born_host,
        born_epoch_s=_epoch(system.born_timestamp),
        store_epoch_s=_epoch(system.store_timestamp) if has("store_timestamp") else None,
        delivery_epoch_s=_epoch(system.delivery_timestamp) if has("delivery_timestamp") else None,
        invisible_duration=_timedelta(system.invisible_duration) if has("invisible_duration") else None,
        corrupted=corrupted,
        dead_letter_topic=system.dead_letter_queue.topic if has("dead_letter_queue") else None)


def _decoded_body(body: bytes, system: pb.SystemProperties) -> tuple[bytes, bool]:
    """The body as the producer sent it, and whether it failed its digest.
    The digest covers the body as stored (before decompression)."""
    corrupted = False
    if system.HasField("body_digest") and system.body_digest.type == pb.CRC32:
        corrupted = f"{zlib.crc32(body):08X}" != system.body_digest.checksum.upper()
    if system.body_encoding == pb.GZIP:
        try:
            body = zlib.decompress(body)  # what RocketMQ's producers write (Deflater)
        except zlib.error:
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError):
                corrupted = True
    return body, corrupted


def _epoch(value: Timestamp) -> float:
    return value.seconds + value.nanos / 1e9


def _datetime(epoch_s: float | None) -> datetime | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, _UTC)


def _timedelta(value: Duration) -> timedelta:
    return _duration(value.seconds, value.nanos)


@functools.lru_cache(maxsize=64)
def _duration(seconds: int, nanos: int) -> timedelta:
    # Every message of a receive carries the same invisible duration: made
    # once (timedeltas are immutable), not per message; and not with
    # Duration.ToTimedelta, which validates and normalises in Python.
    return timedelta(seconds=seconds, microseconds=nanos // 1000)


_UTC = timezone.utc
