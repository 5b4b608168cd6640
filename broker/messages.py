"""Messages between the protocol and the store: apache.rocketmq.v2.Message to
RocketMQ's stored MessageExt and back.

The protocol's system properties become RocketMQ's MessageConst properties in
the stored message (TAGS, KEYS, UNIQ_KEY, __SHARDINGKEY, TIMER_DELIVER_MS,
...), so the commit log reads like RocketMQ's; on delivery they become system
properties again and only the application's own properties are returned as
user properties.
"""
from __future__ import annotations

import functools
import ipaddress
import zlib
from datetime import timedelta

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store import message_const as mc
from store.codec import MessageExt
from store.socket_address import UNSPECIFIED, SocketAddress

# Every MessageConst property name: never returned as a user property (and
# refused as one on send by broker.validation).
SYSTEM_PROPERTY_NAMES = frozenset(
    value for name, value in vars(mc).items()
    if name.isupper() and isinstance(value, str) and name not in ("KEY_SEPARATOR", "TRANSIENT_PREFIX"))


def message_type_of(message: pb.Message) -> int:
    """The type a send carries; the client sets it, the properties imply it."""
    system = message.system_properties
    if system.message_type != pb.MESSAGE_TYPE_UNSPECIFIED:
        return system.message_type
    if system.HasField("message_group"):
        return pb.FIFO
    if system.HasField("delivery_timestamp"):
        return pb.DELAY
    return pb.NORMAL


def timestamp_ms(value: Timestamp) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def to_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def to_duration(delta: timedelta) -> Duration:
    result = Duration()
    result.FromTimedelta(delta)
    return result


@functools.lru_cache(maxsize=256)
def _shared_duration(delta: timedelta) -> Duration:
    # Every message of a receive carries the same invisible duration: convert
    # it once (callers only copy from it, never change it).
    return to_duration(delta)


@functools.lru_cache(maxsize=4096)
def _born_host(text: str) -> SocketAddress:
    # Cached: a producer sends from one host, and parsing an address with
    # ipaddress costs more than the rest of the conversion (py-spy, bench send).
    host = text.rsplit(":", 1)[0] if text.count(":") == 1 else text
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return UNSPECIFIED  # a host name: the stored field holds address bytes only
    return SocketAddress(host.strip("[]"), 0)


def to_stored(message: pb.Message, queue_id: int, topic: str | None = None,
              user_properties: dict[str, str] | None = None) -> MessageExt:
    """The stored form of a message a client sent (to `topic` when the broker
    redirects it, e.g. a half message). `user_properties`: the message's
    user properties already copied out (this takes them over)."""
    system = message.system_properties
    properties = dict(message.user_properties) if user_properties is None else user_properties
    if system.HasField("tag"):
        properties[mc.TAGS] = system.tag
    if system.keys:
        properties[mc.KEYS] = mc.KEY_SEPARATOR.join(system.keys)
    if system.message_id:
        properties[mc.UNIQ_KEY] = system.message_id
    if system.HasField("message_group"):
        properties[mc.MESSAGE_GROUP] = system.message_group
    if system.HasField("delivery_timestamp"):
        properties[mc.TIMER_DELIVER_MS] = str(timestamp_ms(system.delivery_timestamp))
    if system.HasField("trace_context"):
        properties[mc.TRACE_CONTEXT] = system.trace_context
    sys_flag = mc.COMPRESSED_FLAG if system.body_encoding == pb.GZIP else 0
    return MessageExt(topic=topic or message.topic.name, body=message.body, queue_id=queue_id,
                      sys_flag=sys_flag, born_timestamp=timestamp_ms(system.born_timestamp),
                      born_host=_born_host(system.born_host), properties=properties)


def delivered_type(stored: MessageExt) -> int:
    properties = stored.properties
    if mc.MESSAGE_GROUP in properties:
        return pb.FIFO
    if mc.TIMER_DELIVER_MS in properties or mc.DELAY_TIME_LEVEL in properties:
        return pb.DELAY
    if mc.TRANSACTION_PREPARED in properties or mc.transaction_type(stored.sys_flag) == mc.TRANSACTION_COMMIT_TYPE:
        return pb.TRANSACTION
    return pb.NORMAL


def to_delivered(stored: MessageExt, *, topic: str | None = None, receipt_handle: str | None = None,
                 delivery_attempt: int | None = None, invisible_duration: timedelta | None = None,
                 message_id: str | None = None, into: pb.Message | None = None) -> pb.Message:
    """The protocol form of a stored message as a consumer receives it;
    written into `into` (an empty message, such as a response's new element)
    when given, which saves copying it there afterwards."""
    # Built in place, field by field: a submessage handed to a constructor is
    # copied, which made this several times slower (it runs once per message
    # received).
    properties = stored.properties
    if into is None:
        message = pb.Message(body=stored.body)
    else:
        message = into
        message.body = stored.body
    if not SYSTEM_PROPERTY_NAMES.issuperset(properties):
        # Only when there are some: a map handed to the constructor, even an
        # empty one, costs more than the rest of the message's fields.
        message.user_properties.update({k: v for k, v in properties.items() if k not in SYSTEM_PROPERTY_NAMES})
    message.topic.name = topic or stored.topic
    system = message.system_properties
    system.message_id = message_id or properties.get(mc.UNIQ_KEY, "")
    digest = system.body_digest
    digest.type = pb.CRC32
    digest.checksum = f"{zlib.crc32(stored.body):08X}"
    if stored.sys_flag & mc.COMPRESSED_FLAG:
        system.body_encoding = pb.GZIP
    else:
        system.body_encoding = pb.IDENTITY
    system.message_type = delivered_type(stored)
    _set_timestamp(system.born_timestamp, stored.born_timestamp)
    system.born_host = stored.born_host.host
    _set_timestamp(system.store_timestamp, stored.store_timestamp)
    system.store_host = _address_text(stored.store_host)
    system.queue_id = stored.queue_id
    system.queue_offset = stored.queue_offset
    if mc.TAGS in properties:
        system.tag = properties[mc.TAGS]
    if mc.KEYS in properties:
        system.keys.extend(stored.key_list)
    if mc.MESSAGE_GROUP in properties:
        system.message_group = properties[mc.MESSAGE_GROUP]
    if mc.TIMER_DELIVER_MS in properties:
        _set_timestamp(system.delivery_timestamp, int(properties[mc.TIMER_DELIVER_MS]))
    if mc.TRACE_CONTEXT in properties:
        system.trace_context = properties[mc.TRACE_CONTEXT]
    if receipt_handle is not None:
        system.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        system.delivery_attempt = delivery_attempt
    if invisible_duration is not None:
        system.invisible_duration.CopyFrom(_shared_duration(invisible_duration))
    if mc.DLQ_ORIGIN_TOPIC in properties:
        dead_letter = system.dead_letter_queue
        dead_letter.topic = properties[mc.DLQ_ORIGIN_TOPIC]
        dead_letter.message_id = properties.get(mc.DLQ_ORIGIN_MESSAGE_ID, "")
    return message


def _set_timestamp(field: Timestamp, ms: int) -> None:
    field.seconds = ms // 1000
    field.nanos = (ms % 1000) * 1_000_000


@functools.lru_cache(maxsize=256)
def _address_text(address: SocketAddress) -> str:
    # A node stores every message with its own address: format it once.
    return str(address)
