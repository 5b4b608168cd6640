"""The checks a request passes before it touches the store, as RocketMQ 5 makes them.

Each function is pure: it takes plain values (and, where time matters, `now`)
and either returns or raises `BrokerError` with the code a RocketMQ 5 proxy
answers for the same input, so clients react as they do against RocketMQ.
Limits come from `ValidationLimits`; each default names the RocketMQ setting it
copies (apache/rocketmq: proxy/.../config/ProxyConfig.java, client/.../Validators.java,
common/.../topic/TopicValidator.java, common/.../message/MessageConst.java).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2
from rpcgen.apache.rocketmq.v2.definition_pb2 import Code, MessageType, SystemProperties

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class ValidationLimits:
    """Every limit a check enforces, with RocketMQ 5's default."""

    # ProxyConfig.maxMessageSize (4 MiB), also the broker's maxMessageSize.
    max_body_bytes: int = 4 * MIB
    # ProxyConfig.maxUserPropertySize (16 KiB): user properties' keys and
    # values plus the tag and the keys, in UTF-8 bytes.
    max_user_property_bytes: int = 16 * KIB
    # ProxyConfig.userPropertyMaxNum.
    max_user_property_count: int = 128
    # The stored message keeps its properties' length in a 2-byte field
    # (CommitLog's Short.MAX_VALUE check): system and user properties together.
    max_properties_bytes: int = 32767
    # ProxyConfig.maxMessageGroupSize; the proxy refuses a group of this many
    # UTF-8 bytes or more.
    max_message_group_bytes: int = 64
    # RocketMQ sets no tag limit; its documentation recommends tags of at most
    # 128 characters, which we enforce so that filters and hashes stay cheap.
    max_tag_chars: int = 128
    # Validators.TOPIC_MAX_LENGTH and Validators.CHARACTER_MAX_LENGTH.
    max_topic_chars: int = 127
    max_group_chars: int = 255
    # ProxyConfig.minInvisibleTimeMillsForRecv (10 s) and maxInvisibleTimeMills
    # (12 h); ChangeInvisibleDuration may go down to zero (an immediate retry).
    min_receive_invisible: timedelta = timedelta(seconds=10)
    max_invisible: timedelta = timedelta(hours=12)
    # ProxyConfig.grpcClientConsumerMin/MaxLongPollingTimeoutMillis (5 s, 20 s).
    min_long_polling: timedelta = timedelta(seconds=5)
    max_long_polling: timedelta = timedelta(seconds=20)
    # ProxyConfig.maxDelayTimeMills (1 day).
    max_delay: timedelta = timedelta(days=1)


DEFAULT_LIMITS = ValidationLimits()

# TopicValidator's character set, for topics and consumer groups alike.
NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# TopicValidator.SYSTEM_TOPIC_SET and SYSTEM_TOPIC_PREFIX: the proxy refuses
# them on every client RPC ("cannot access system topic").
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX_V2", "BenchmarkTest",
    "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# Retry and dead-letter topics are written by the broker; a client sending to
# them would forge redeliveries. (Ours: RocketMQ only refuses SYSTEM_TOPICS.)
BROKER_WRITTEN_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")
# MixAll.CID_RMQ_SYS_PREFIX (refused by the proxy) and MixAll's internal groups.
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
SYSTEM_GROUPS = frozenset({
    "DEFAULT_CONSUMER", "TOOLS_CONSUMER", "SCHEDULE_CONSUMER", "FILTERSRV_CONSUMER",
    "__MONITOR_CONSUMER", "SELF_TEST_C_GROUP",
})
# MessageConst.STRING_HASH_SET: property names the broker itself writes.
RESERVED_PROPERTY_KEYS = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC",
    "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET",
    "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG",
    "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
    "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET",
    "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP",
    # Ours: a producer setting it could mark someone's timer as delivered.
    "TIMER_ORIGIN_OFFSET",
})
# The one reserved name a producer may set: a 4.x-style delay level (what
# Message.setDelayTimeLevel writes), validated as one.
DELAY_LEVEL_PROPERTY = "DELAY"
# A 5.x client's id: version 01 and 16 bytes in hex (34 characters); 4.x
# clients' UNIQ_KEY: 16 bytes in hex (32 characters).
MESSAGE_ID_PATTERN = re.compile(r"^(01)?[0-9A-Fa-f]{32}$")
# RocketMQ's properties encoding: name 0x01 value 0x02, per property.
PROPERTY_SEPARATOR_BYTES = 2


def contains_control_character(text: str) -> bool:
    """Java's Character.isISOControl over the text (C0, DEL and C1), as the proxy checks.

    Besides garbage, this keeps 0x01/0x02 out of names and values, which the
    stored properties use as separators.
    """
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


# ------------------------------------------------------------- topics, groups


def validate_topic(topic: str, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """A topic any client RPC may name (route, receive, ack, ...)."""
    _check_name(topic, "topic", limits.max_topic_chars, definition_pb2.ILLEGAL_TOPIC)
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        raise BrokerError(definition_pb2.ILLEGAL_TOPIC, f"cannot access system topic {topic!r}")


def validate_send_topic(topic: str, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """A topic a producer may write: not a system, retry or dead-letter topic."""
    validate_topic(topic, limits)
    if topic.startswith(BROKER_WRITTEN_TOPIC_PREFIXES):
        raise BrokerError(definition_pb2.ILLEGAL_TOPIC,
                          f"cannot send to {topic!r}: retry and dead-letter topics are written by the broker")


def validate_consumer_group(group: str, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    _check_name(group, "consumer group", limits.max_group_chars, definition_pb2.ILLEGAL_CONSUMER_GROUP)
    if group in SYSTEM_GROUPS or group.startswith(SYSTEM_GROUP_PREFIX):
        raise BrokerError(definition_pb2.ILLEGAL_CONSUMER_GROUP, f"cannot use system consumer group {group!r}")


def _check_name(name: str, what: str, max_chars: int, code: Code) -> None:
    if not name.strip():
        raise BrokerError(code, f"the {what} is blank")
    if len(name) > max_chars:
        raise BrokerError(code, f"the {what} is {len(name)} characters long; the maximum is {max_chars}")
    if not NAME_PATTERN.match(name):
        raise BrokerError(code, f"the {what} {name!r} may only contain letters, digits, '%', '|', '_' and '-'")


# ---------------------------------------------------------- message contents


def validate_tag(tag: str, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """An empty tag means "untagged" and is fine; anything else must be a usable tag."""
    if tag == "":
        return
    code = definition_pb2.ILLEGAL_MESSAGE_TAG
    if not tag.strip():
        raise BrokerError(code, "the tag cannot be only whitespace")
    if "|" in tag:
        raise BrokerError(code, f"the tag {tag!r} cannot contain '|' (it separates tags in filters)")
    if contains_control_character(tag):
        raise BrokerError(code, f"the tag {tag!r} cannot contain control characters")
    if len(tag) > limits.max_tag_chars:
        raise BrokerError(code, f"the tag is {len(tag)} characters long; the maximum is {limits.max_tag_chars}")


def validate_keys(keys: Sequence[str]) -> None:
    """Business keys, indexed for lookup. Empty ones are ignored, as by the proxy."""
    for key in keys:
        if key == "":
            continue
        if not key.strip():
            raise BrokerError(definition_pb2.ILLEGAL_MESSAGE_KEY, "a key cannot be only whitespace")
        if contains_control_character(key):
            raise BrokerError(definition_pb2.ILLEGAL_MESSAGE_KEY, f"the key {key!r} cannot contain control characters")


def validate_message_group(group: str, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """A FIFO message group; empty means none."""
    if group == "":
        return
    code = definition_pb2.ILLEGAL_MESSAGE_GROUP
    if not group.strip():
        raise BrokerError(code, "the message group cannot be only whitespace")
    if _utf8_len(group) >= limits.max_message_group_bytes:
        raise BrokerError(code, f"the message group must be shorter than {limits.max_message_group_bytes} UTF-8 bytes")
    if contains_control_character(group):
        raise BrokerError(code, f"the message group {group!r} cannot contain control characters")


def validate_message_id(message_id: str) -> None:
    """Ids are made by clients and reused by their retries, so the broker can dedupe on them."""
    if not message_id.strip():
        raise BrokerError(definition_pb2.ILLEGAL_MESSAGE_ID, "the message id cannot be empty")
    if not MESSAGE_ID_PATTERN.match(message_id):
        raise BrokerError(definition_pb2.ILLEGAL_MESSAGE_ID,
                          f"the message id {message_id!r} is not 32 hex digits, optionally after the version '01'")


def validate_user_properties(properties: Mapping[str, str], tag: str = "", keys: Sequence[str] = (),
                             limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """Application properties: no names the broker reserves, and within the proxy's size.

    The size counts the tag and the keys too, as the proxy does: they are
    stored as properties.
    """
    if not properties and not keys and len(tag) * 4 <= limits.max_user_property_bytes:
        return  # the common case, checked per message sent: nothing to walk (UTF-8 takes <= 4 bytes a char)
    if len(properties) > limits.max_user_property_count:
        raise BrokerError(definition_pb2.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"{len(properties)} user properties; the maximum is {limits.max_user_property_count}")
    for name, value in properties.items():
        _check_property(name, value)
    size = sum(_utf8_len(n) + _utf8_len(v) for n, v in properties.items())
    size += _utf8_len(tag) + sum(_utf8_len(k) for k in keys)
    if size > limits.max_user_property_bytes:
        raise BrokerError(definition_pb2.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"user properties, tag and keys take {size} bytes; the maximum is {limits.max_user_property_bytes}")


def _check_property(name: str, value: str) -> None:
    code = definition_pb2.ILLEGAL_MESSAGE_PROPERTY_KEY
    if not name.strip():
        raise BrokerError(code, "a property name cannot be empty or only whitespace")
    if name in RESERVED_PROPERTY_KEYS:
        raise BrokerError(code, f"the property name {name!r} is reserved for the broker")
    if contains_control_character(name) or contains_control_character(value):
        raise BrokerError(code, f"the property {name!r} cannot contain control characters")


def validate_properties_size(properties: Mapping[str, str], limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """All properties as they will be stored (system and user), against the store's 2-byte length."""
    size = sum(_utf8_len(n) + _utf8_len(v) + PROPERTY_SEPARATOR_BYTES for n, v in properties.items())
    if size > limits.max_properties_bytes:
        raise BrokerError(definition_pb2.MESSAGE_PROPERTIES_TOO_LARGE,
                          f"the message's properties take {size} bytes; the maximum is {limits.max_properties_bytes}")


def validate_body(body: bytes, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    if not body:
        raise BrokerError(definition_pb2.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > limits.max_body_bytes:
        raise BrokerError(definition_pb2.MESSAGE_BODY_TOO_LARGE,
                          f"the message body is {len(body)} bytes; the maximum is {limits.max_body_bytes}")


# ------------------------------------------------------------ message types


def validate_message_type(properties: SystemProperties, has_delay_level: bool = False) -> None:
    """The declared type must be the one the message's properties call for.

    A message group makes a FIFO message, a delivery timestamp or a delay
    level (the user property DELAY) a DELAY one, a lite topic a LITE one and a
    priority a PRIORITY one; a NORMAL or TRANSACTION message has none of them.
    An unspecified type is accepted when the properties call for at most one
    type. A delay level on a NORMAL message is accepted as DELAY: the official
    5.x clients call every message without a delivery timestamp NORMAL, so a
    4.x habit (a DELAY property) could not be sent through them otherwise.
    """
    implied = _implied_types(properties)
    if has_delay_level:
        if definition_pb2.DELAY in implied:
            raise BrokerError(definition_pb2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                              "a message has a delivery_timestamp and a delay level (DELAY); give one of them")
        implied.add(definition_pb2.DELAY)
    declared = properties.message_type
    if declared == definition_pb2.MESSAGE_TYPE_UNSPECIFIED:
        conflict = len(implied) > 1
    elif declared == definition_pb2.NORMAL:
        conflict = bool(implied - {definition_pb2.DELAY}) if has_delay_level else bool(implied)
    elif declared == definition_pb2.TRANSACTION:
        conflict = bool(implied)
    else:
        conflict = implied != {declared}
    if conflict:
        found = ", ".join(sorted(_REQUIRED_PROPERTY[t] for t in implied)) or "none of them"
        raise BrokerError(definition_pb2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          f"a {MessageType.Name(declared)} message has {found}; FIFO needs message_group, "
                          "DELAY delivery_timestamp (or a delay level), LITE lite_topic, PRIORITY priority, "
                          "and only that one")


_REQUIRED_PROPERTY = {
    definition_pb2.FIFO: "message_group",
    definition_pb2.DELAY: "delivery_timestamp or a delay level",
    definition_pb2.LITE: "lite_topic",
    definition_pb2.PRIORITY: "priority",
}


def _implied_types(properties: SystemProperties) -> set[MessageType]:
    # Called for every message sent: plain ifs, no per-call dict.
    implied: set[MessageType] = set()
    if properties.message_group:
        implied.add(definition_pb2.FIFO)
    if properties.HasField("delivery_timestamp"):
        implied.add(definition_pb2.DELAY)
    if properties.lite_topic:
        implied.add(definition_pb2.LITE)
    if properties.HasField("priority"):
        implied.add(definition_pb2.PRIORITY)
    return implied


def validate_delivery_timestamp(delivery_ms: int, now_ms: int, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """A timed message may be due now or in the past (delivered at once), not beyond the max delay."""
    delay_ms = delivery_ms - now_ms
    max_ms = limits.max_delay // timedelta(milliseconds=1)
    if delay_ms > max_ms:
        raise BrokerError(definition_pb2.ILLEGAL_DELIVERY_TIME,
                          f"the delivery time is {delay_ms} ms ahead; the maximum delay is {max_ms} ms")


def validate_delay_level(text: str, max_level: int) -> int:
    """A delay level as the DELAY property carries it: an integer from 1; one
    above `max_level` means `max_level` (RocketMQ clamps the same way)."""
    try:
        level = int(text.strip())
    except ValueError:
        raise BrokerError(definition_pb2.ILLEGAL_DELIVERY_TIME,
                          f"the delay level (property DELAY) {text!r} is not an integer 1..{max_level}") from None
    if level < 1:
        raise BrokerError(definition_pb2.ILLEGAL_DELIVERY_TIME,
                          f"the delay level (property DELAY) is {level}; levels are 1..{max_level}")
    return min(level, max_level)


# ---------------------------------------------------------------- consuming


def validate_invisible_duration(duration: timedelta, *, for_receive: bool,
                                limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """A received message's lease. ReceiveMessage needs at least the minimum;
    ChangeInvisibleDuration may shorten it to zero (retry now)."""
    minimum = limits.min_receive_invisible if for_receive else timedelta(0)
    if duration < minimum:
        raise BrokerError(definition_pb2.ILLEGAL_INVISIBLE_TIME,
                          f"the invisible duration {duration.total_seconds()} s is below the minimum "
                          f"{minimum.total_seconds()} s")
    if duration > limits.max_invisible:
        raise BrokerError(definition_pb2.ILLEGAL_INVISIBLE_TIME,
                          f"the invisible duration {duration.total_seconds()} s is above the maximum "
                          f"{limits.max_invisible.total_seconds()} s")


def effective_long_polling_timeout(requested: timedelta | None, deadline_remaining: timedelta | None,
                                   request_timeout: timedelta,
                                   limits: ValidationLimits = DEFAULT_LIMITS, held: bool = False) -> timedelta:
    """How long a ReceiveMessage may wait for messages, as the 5.x proxy decides it.

    The proxy does not refuse a requested timeout outside its range: it clamps
    it to [min, max]. Without one, it waits the call's remaining deadline less
    half the client's request timeout. Only when the call's deadline leaves
    less than the minimum does it answer ILLEGAL_POLLING_TIME: the response
    could not arrive before the client gives up. `held`: the call's own
    deadline was checked where it arrived (`check_polling_deadline`) and the
    time since went into holding it through a leader change; then it waits
    what is left, if anything, rather than failing.
    """
    if requested is None:
        remaining = deadline_remaining if deadline_remaining is not None else limits.max_long_polling
        requested = remaining - request_timeout / 2
    polling = min(max(requested, limits.min_long_polling), limits.max_long_polling)
    if deadline_remaining is None or polling <= deadline_remaining:
        return polling
    if deadline_remaining >= limits.min_long_polling or held:
        return max(deadline_remaining, timedelta(0))
    raise BrokerError(definition_pb2.ILLEGAL_POLLING_TIME,
                      f"the call's deadline leaves {deadline_remaining.total_seconds()} s, less than the "
                      f"minimum long polling time {limits.min_long_polling.total_seconds()} s")


def check_polling_deadline(deadline_remaining: timedelta | None, limits: ValidationLimits = DEFAULT_LIMITS) -> None:
    """ILLEGAL_POLLING_TIME for a receive whose deadline, as it arrives, is
    under the minimum long polling time (the check a receive gets where it
    enters the cluster, before it may be held or forwarded)."""
    if deadline_remaining is not None and deadline_remaining < limits.min_long_polling:
        raise BrokerError(definition_pb2.ILLEGAL_POLLING_TIME,
                          f"the call's deadline leaves {deadline_remaining.total_seconds()} s, less than the "
                          f"minimum long polling time {limits.min_long_polling.total_seconds()} s")
