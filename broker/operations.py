"""Operations: message query, consumer progress, offset reset, resend and
dead letters, as an operator uses them (RocketMQ's mqadmin queryMsgByKey,
queryMsgById, queryMsgByOffset, consumerProgress, resetOffsetByTime and the
Dashboard's resend and dead-letter pages).

The decisions live here; broker/operations_service.py is the gRPC edge.

Queries read only what the apply loop derived from committed entries (the
IndexFile, the ConsumeQueues, the replicated pop state and offsets), so any
node answers them, a follower as well as the leader, and the answers hold
after a leader change. Changes go through the log: an offset reset is one
entry of pop `reset` ops (one per queue) followed by one of consumer
offsets, a resend one pop `resend` op; the caller runs on the leader.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from broker import validation
from broker.admin import is_system_topic
from broker.consumer import ConsumerService
from broker.consumer.pop_state import ATTEMPT, DEADLINE, PopQueue, ResendOp, ResetOp
from broker.consumer.source import initial_offset
from broker.errors import BrokerError
from broker.topics import TopicService, dlq_topic
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store import message_const as mc
from store.codec import MessageExt
from store.message_id import create_offset_message_id, decode_offset_message_id, parse_client_message_id
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig
from store.topic_config import TopicConfig

log = logging.getLogger(__name__)

DEFAULT_MAX = 32
# A query answers whole messages (bodies up to 4 MiB): more than this per call
# is a mistake, not a query.
MAX_RESULTS = 1000
# Dead letters counted per origin topic: the newest this many (a scan).
DEAD_LETTERS_SCANNED = 10_000
# Time ranges end here when none is given: far past any store time.
END_OF_TIME_MS = 1 << 62

DeliveryState = Literal["pending", "in_flight", "awaiting_redelivery", "blocked", "consumed"]


@dataclass(frozen=True)
class Delivery:
    group: str
    state: DeliveryState
    attempts: int = 0            # known while in flight
    lease_deadline_ms: int = 0


@dataclass(frozen=True)
class FoundMessage:
    message: MessageExt
    delivery: Delivery | None = None

    @property
    def offset_message_id(self) -> str:
        return create_offset_message_id(self.message.store_host, self.message.physical_offset)


@dataclass(frozen=True)
class QueueProgress:
    topic: str
    queue_id: int
    committed_offset: int        # -1: not started here
    min_offset: int
    max_offset: int
    in_flight: int = 0
    retrying: int = 0
    expired: int = 0
    blocked: int = 0
    last_consumed_store_ms: int = 0

    @property
    def lag(self) -> int:
        start = self.min_offset if self.committed_offset < 0 else max(self.committed_offset, self.min_offset)
        return max(0, self.max_offset - start)


@dataclass
class GroupProgress:
    group: str
    queues: list[QueueProgress] = field(default_factory=list)
    dead_letters: int = 0
    dead_letters_by_topic: dict[str, int] = field(default_factory=dict)

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


@dataclass(frozen=True)
class QueueReset:
    queue_id: int
    previous_offset: int
    offset: int


ResetTarget = tuple[Literal["time"], int] | tuple[Literal["earliest", "latest"], None] | \
    tuple[Literal["queue"], tuple[int, int]]


def check_max(value: int, what: str = "max") -> int:
    """0 means the default; more than MAX_RESULTS is refused, not cut."""
    if value == 0:
        return DEFAULT_MAX
    if not 0 < value <= MAX_RESULTS:
        raise BrokerError(pb.BAD_REQUEST, f"{what} must be 1 to {MAX_RESULTS}, not {value}")
    return value


def check_time_range(begin_ms: int, end_ms: int) -> tuple[int, int]:
    """0 means open; an end before the begin is refused."""
    if begin_ms < 0 or end_ms < 0:
        raise BrokerError(pb.BAD_REQUEST, f"times must be ms since the epoch, not {begin_ms} and {end_ms}")
    end = end_ms or END_OF_TIME_MS
    if end < begin_ms:
        raise BrokerError(pb.BAD_REQUEST, f"the end {end_ms} is before the begin {begin_ms}")
    return begin_ms, end


class Operations:
    def __init__(self, store: MessageStore, topics: TopicService, consumer: ConsumerService) -> None:
        self.store = store
        self.topics = topics
        self.consumer = consumer

    # ========================================================= message query
    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 0, max_num: int = 0,
                     group: str = "") -> list[FoundMessage]:
        self._topic(topic)
        if not key:
            raise BrokerError(pb.BAD_REQUEST, "the key is empty")
        begin, end = check_time_range(begin_ms, end_ms)
        limit = check_max(max_num)
        group_config = self._optional_group(group)
        found = self.store.query_messages(topic, key, limit, begin, end)
        return [self._found(m, group_config) for m in found]

    def query_by_id(self, message_id: str, topic: str = "", group: str = "") -> list[FoundMessage]:
        """By offset message id (32 or 56 hex digits: read where it points),
        else by client message id (34 hex digits starting 01) in `topic` or,
        without one, in every non-system topic."""
        group_config = self._optional_group(group)
        if topic:
            self._topic(topic)
        message = self._by_offset_id(message_id)
        if message is not None:
            if topic and message.topic != topic:
                return []
            return [self._found(message, group_config)]
        try:
            parse_client_message_id(message_id)
        except ValueError:
            raise BrokerError(pb.BAD_REQUEST, f"{message_id!r} is neither an offset message id (32 or 56 hex "
                                              f"digits) nor a client message id (34 hex digits starting 01)") \
                from None
        names = [topic] if topic else [c.topic_name for c in self.store.topics.topics.values()
                                       if not is_system_topic(c.topic_name)]
        found: list[FoundMessage] = []
        for name in sorted(names):
            for message in self.store.query_messages(name, message_id, MAX_RESULTS, 0, END_OF_TIME_MS):
                if message.uniq_key == message_id:
                    found.append(self._found(message, group_config))
        return found

    def _by_offset_id(self, message_id: str) -> MessageExt | None:
        """The message an offset message id names; None when it is not one
        (NOT_FOUND when it is one but names no committed message)."""
        if len(message_id) not in (32, 56):
            return None
        try:
            _, physical_offset = decode_offset_message_id(message_id)
        except ValueError:
            return None
        message = self.store.read_message(physical_offset) if physical_offset > 0 else None
        if message is None or message.physical_offset != physical_offset:
            raise BrokerError(pb.MESSAGE_NOT_FOUND, f"no committed message at physical offset {physical_offset} "
                                                    f"(offset message id {message_id})")
        return message

    def query_by_offset(self, topic: str, queue_id: int, offset: int | None, timestamp_ms: int | None,
                        count: int = 0, group: str = "") -> tuple[list[FoundMessage], int]:
        """Messages of one queue from `offset`, or from the first offset stored
        at or after `timestamp_ms` (searchOffset); with the offset to go on from."""
        config = self._topic(topic)
        self._queue_id(config, queue_id)
        limit = check_max(count or 1, "count")
        group_config = self._optional_group(group)
        low, high = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
        if timestamp_ms is not None:
            if timestamp_ms < 0:
                raise BrokerError(pb.BAD_REQUEST, f"time {timestamp_ms} must be ms since the epoch")
            offset = self.store.offset_by_time(topic, queue_id, timestamp_ms)
        assert offset is not None
        if not low <= offset <= high:
            raise BrokerError(pb.ILLEGAL_OFFSET, f"offset {offset} is outside {topic}/{queue_id}'s retained "
                                                 f"range {low}..{high}")
        result = self.store.get_messages(topic, queue_id, offset, limit)
        found = [self._found(m, group_config) for m in result.messages]
        return found, result.next_offset if result.messages else offset

    # ============================================================== delivery
    def delivery_of(self, group: SubscriptionGroupConfig, message: MessageExt, now_ms: int | None = None) -> Delivery:
        """Where `message` stands for `group`, from the replicated pop state
        (or, for a group that only pulls, its committed offset)."""
        name, offset = group.group_name, message.queue_offset
        queue = self.consumer.state.queue(name, message.topic, message.queue_id)
        if queue is None:
            committed = self.store.offsets.query(name, message.topic, message.queue_id)
            consumed = committed is not None and offset < committed
            return Delivery(name, "consumed" if consumed else "pending")
        lease = queue.in_flight.get(offset)
        if lease is not None:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            state: DeliveryState = "in_flight" if lease[DEADLINE] > now else "awaiting_redelivery"
            return Delivery(name, state, lease[ATTEMPT], lease[DEADLINE])
        if offset in queue.blocked:
            return Delivery(name, "blocked")
        return Delivery(name, "consumed" if offset < queue.pop_offset else "pending")

    def _found(self, message: MessageExt, group: SubscriptionGroupConfig | None) -> FoundMessage:
        return FoundMessage(message, self.delivery_of(group, message) if group is not None else None)

    # ================================================================ resend
    async def resend(self, message_id: str, topic: str, group: str) -> tuple[FoundMessage, int]:
        """Deliver a consumed message once more to `group` (a pop `resend` op)."""
        config = self._group(group)
        found = self.query_by_id(message_id, topic)
        if not found:
            raise BrokerError(pb.MESSAGE_NOT_FOUND, f"no message {message_id}" + (f" in topic {topic!r}" if topic else ""))
        if len({(f.message.topic, f.message.queue_id, f.message.queue_offset) for f in found}) > 1:
            raise BrokerError(pb.BAD_REQUEST, f"message id {message_id} names {len(found)} stored messages; "
                                              f"resend one of them by its offset message id")
        return await self._resend(found[0].message, config)

    async def _resend(self, message: MessageExt, config: SubscriptionGroupConfig) -> tuple[FoundMessage, int]:
        group = config.group_name
        if is_system_topic(message.topic):
            raise BrokerError(pb.BAD_REQUEST, f"{message.topic} is a system topic; resend the original message")
        await self.consumer.committer.ready()
        delivery = self.delivery_of(config, message)
        if delivery.state != "consumed":
            raise BrokerError(pb.BAD_REQUEST, f"message {message.topic}/{message.queue_id}@{message.queue_offset} "
                                              f"is {delivery.state.replace('_', ' ')} for group {group!r}; only a "
                                              f"consumed message is resent")
        state = self.consumer.state
        queue = state.queue(group, message.topic, message.queue_id)
        initial = None if queue is not None else initial_offset(self.store, group, message.topic, message.queue_id)
        message_group = message.properties.get(mc.MESSAGE_GROUP, "") if config.consume_message_orderly else None
        index = await self.consumer.committer.commit(
            [ResendOp(group, message.topic, message.queue_id, message.queue_offset, message_group, initial)])
        lease = state.lease_of(group, message.topic, message.queue_id, message.queue_offset)
        if lease is None or lease.lease != index:
            raise BrokerError(pb.BAD_REQUEST, "the message was delivered to the group meanwhile; nothing resent")
        log.info("resent %s/%d@%d to group %s (entry %d)", message.topic, message.queue_id, message.queue_offset,
                 group, index)
        return FoundMessage(message, self.delivery_of(config, message)), index

    # ============================================================== progress
    def progress(self, group: str, topic: str = "", now_ms: int | None = None) -> GroupProgress:
        self._group(group)
        if topic:
            names = [self._topic(topic).topic_name]
        else:
            names = sorted({key[1] for key, _ in self.consumer.state if key[0] == group} |
                           {key.rsplit("@", 1)[0] for key in self.store.offsets.offsets
                            if key.rsplit("@", 1)[-1] == group})
        now = int(time.time() * 1000) if now_ms is None else now_ms
        result = GroupProgress(group)
        for name in names:
            config = self.topics.get(name)
            if config is None:
                continue
            for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
                result.queues.append(self._queue_progress(group, name, queue_id, now))
        dlq = dlq_topic(group)
        result.dead_letters = self.store.max_offset(dlq, 0) - self.store.min_offset(dlq, 0)
        result.dead_letters_by_topic = self._dead_letters_by_topic(dlq)
        return result

    def _queue_progress(self, group: str, topic: str, queue_id: int, now_ms: int) -> QueueProgress:
        low, high = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
        queue: PopQueue | None = self.consumer.state.queue(group, topic, queue_id)
        if queue is None:
            stored = self.store.offsets.query(group, topic, queue_id)
            committed = -1 if stored is None else stored
            in_flight = retrying = expired = blocked = 0
        else:
            committed = queue.consumed_offset()
            leases = list(queue.in_flight.values())
            in_flight, blocked = len(leases), len(queue.blocked)
            retrying = sum(1 for lease in leases if lease[ATTEMPT] > 1)
            expired = sum(1 for lease in leases if lease[DEADLINE] <= now_ms)
        last = 0
        if low < committed <= high:
            found = self.store.get_messages(topic, queue_id, committed - 1, 1)
            if found.messages:
                last = found.messages[0].store_timestamp
        return QueueProgress(topic, queue_id, committed, low, high, in_flight, retrying, expired, blocked, last)

    def _dead_letters_by_topic(self, dlq: str) -> dict[str, int]:
        high = self.store.max_offset(dlq, 0)
        start = max(self.store.min_offset(dlq, 0), high - DEAD_LETTERS_SCANNED)
        counts: Counter[str] = Counter()
        while start < high:
            found = self.store.get_messages(dlq, 0, start, MAX_RESULTS)
            if not found.messages:
                break
            counts.update(m.properties.get(mc.DLQ_ORIGIN_TOPIC, "") for m in found.messages)
            start = found.next_offset
        return dict(sorted(counts.items()))

    # ================================================================= reset
    async def reset(self, group: str, topic: str, target: ResetTarget) -> tuple[list[QueueReset], int]:
        """Move `group` on `topic`: every queue to the first offset stored at
        or after a time, to its first or end offset, or one queue to an offset.
        One entry of pop resets (what receivers read, so connected consumers
        follow at once), then one of consumer offsets (what pull consumers read)."""
        self._group(group)
        config = self._topic(topic)
        await self.consumer.committer.ready()
        targets = self._reset_targets(config, target)
        resets = [QueueReset(q, self._progress_offset(group, topic, q), offset) for q, offset in targets]
        index = await self.consumer.committer.commit([ResetOp(group, topic, r.queue_id, r.offset) for r in resets])
        await self.store.commit_offsets([(group, topic, r.queue_id, r.offset) for r in resets])
        log.info("reset group %s on %s: %s (entry %d)", group, topic,
                 ", ".join(f"{r.queue_id}: {r.previous_offset} -> {r.offset}" for r in resets), index)
        return resets, index

    def _reset_targets(self, config: TopicConfig, target: ResetTarget) -> list[tuple[int, int]]:
        topic = config.topic_name
        kind, value = target
        queues = range(max(config.read_queue_nums, config.write_queue_nums))
        if kind == "time":
            assert isinstance(value, int)
            if value < 0:
                raise BrokerError(pb.BAD_REQUEST, f"time {value} must be ms since the epoch")
            return [(q, self.store.offset_by_time(topic, q, value)) for q in queues]
        if kind == "earliest":
            return [(q, self.store.min_offset(topic, q)) for q in queues]
        if kind == "latest":
            return [(q, self.store.max_offset(topic, q)) for q in queues]
        if kind == "queue":
            assert isinstance(value, tuple)
            queue_id, offset = value
            self._queue_id(config, queue_id)
            low, high = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
            if not low <= offset <= high:
                raise BrokerError(pb.ILLEGAL_OFFSET, f"offset {offset} is outside {topic}/{queue_id}'s retained "
                                                     f"range {low}..{high}")
            return [(queue_id, offset)]
        raise BrokerError(pb.BAD_REQUEST, "say where to reset to: a time, earliest, latest, or a queue and offset")

    def _progress_offset(self, group: str, topic: str, queue_id: int) -> int:
        queue = self.consumer.state.queue(group, topic, queue_id)
        if queue is not None:
            return queue.consumed_offset()
        stored = self.store.offsets.query(group, topic, queue_id)
        return -1 if stored is None else stored

    # ========================================================== dead letters
    def dead_letters(self, group: str, max_num: int = 0, before_offset: int = 0) -> tuple[list[FoundMessage], int]:
        """The newest dead letters of `group` (below `before_offset` when
        given), newest first, with the offset to page on from (0: no more)."""
        validation.validate_consumer_group(group)
        limit = check_max(max_num)
        if before_offset < 0:
            raise BrokerError(pb.BAD_REQUEST, f"before_offset {before_offset} is negative")
        dlq = dlq_topic(group)
        low, high = self.store.min_offset(dlq, 0), self.store.max_offset(dlq, 0)
        end = min(high, before_offset) if before_offset else high
        start = max(low, end - limit)
        messages = self.store.get_messages(dlq, 0, start, end - start).messages if end > start else []
        return [FoundMessage(m) for m in reversed(messages)], start if start > low else 0

    async def resend_dead_letter(self, group: str, message_id: str) -> tuple[FoundMessage, int]:
        """Deliver a dead letter's original message (still in its topic) once
        more to the group that gave up on it."""
        config = self._group(group)
        letters = self.query_by_id(message_id, dlq_topic(group)) if len(message_id) not in (32, 56) \
            else self.query_by_id(message_id)
        letters = [f for f in letters if f.message.topic == dlq_topic(group)]
        if not letters:
            raise BrokerError(pb.MESSAGE_NOT_FOUND, f"no dead letter {message_id} in {dlq_topic(group)}")
        letter = letters[0].message
        origin_topic = letter.properties.get(mc.DLQ_ORIGIN_TOPIC, "")
        origin_id = letter.properties.get(mc.DLQ_ORIGIN_MESSAGE_ID, "") or letter.uniq_key or ""
        if not origin_topic or self.topics.get(origin_topic) is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"the dead letter's topic {origin_topic!r} does not exist any more")
        originals = [m for m in self.store.query_messages(origin_topic, origin_id, MAX_RESULTS, 0, END_OF_TIME_MS)
                     if m.uniq_key == origin_id]
        if not originals:
            raise BrokerError(pb.MESSAGE_NOT_FOUND, f"the original of dead letter {message_id} ({origin_topic}, "
                                                    f"{origin_id}) is gone with retention")
        # The oldest copy is the one the group consumed first (a producer
        # retry may have stored it twice).
        original = min(originals, key=lambda m: m.physical_offset)
        return await self._resend(original, config)

    # =============================================================== lookups
    def _topic(self, topic: str) -> TopicConfig:
        validation.validate_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return config

    @staticmethod
    def _queue_id(config: TopicConfig, queue_id: int) -> None:
        count = max(config.read_queue_nums, config.write_queue_nums)
        if not 0 <= queue_id < count:
            raise BrokerError(pb.BAD_REQUEST, f"topic {config.topic_name!r} has no queue {queue_id} "
                                              f"(it has {count})")

    def _group(self, group: str) -> SubscriptionGroupConfig:
        validation.validate_consumer_group(group)
        config = self.store.groups.get(group)
        if config is None:
            raise BrokerError(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist")
        return config

    def _optional_group(self, group: str) -> SubscriptionGroupConfig | None:
        return self._group(group) if group else None
