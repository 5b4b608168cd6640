"""Admin: topics, consumer groups and lag, as an operator changes them.

The decisions live here (what may be created, changed or deleted, and what
lag is); broker/admin_service.py is the gRPC edge. Every change is a system
entry through the leader's log (MessageStore.update_topic, update_group), so
every replica sees the same topics and groups; the caller runs on the leader.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from broker import validation
from broker.errors import BrokerError
from broker.topics import TopicService
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig
from store.topic_config import MESSAGE_TYPE_ATTRIBUTE, PERM_READ, PERM_WRITE, TopicConfig

log = logging.getLogger(__name__)

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
# More queues buy nothing on one broker group but cost a ConsumeQueue each.
MAX_QUEUES = 1024
# RocketMQ takes any retryMaxTimes; past this a message would be retried for
# weeks on the 2-hour rung of the backoff ladder, which is surely a typo.
MAX_RETRIES = 1000
DEFAULT_MAX_RETRIES = SubscriptionGroupConfig.retry_max_times
PERMISSIONS: dict[pb.Permission, int] = {pb.NONE: 0, pb.READ: PERM_READ, pb.WRITE: PERM_WRITE, pb.READ_WRITE: PERM_READ | PERM_WRITE}


@dataclass(frozen=True)
class QueueLag:
    topic: str
    queue_id: int
    committed_offset: int  # -1: nothing committed
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        start = self.min_offset if self.committed_offset < 0 else max(self.committed_offset, self.min_offset)
        return max(0, self.max_offset - start)


def is_system_topic(topic: str) -> bool:
    return (topic in validation.SYSTEM_TOPICS or topic.startswith(validation.SYSTEM_TOPIC_PREFIX)
            or topic.startswith(validation.BROKER_WRITTEN_TOPIC_PREFIXES))


def permission_of(perm: int) -> pb.Permission:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    return pb.READ_WRITE if readable and writable else pb.READ if readable else pb.WRITE if writable else pb.NONE


class Admin:
    def __init__(self, store: MessageStore, topics: TopicService, default_queues: int) -> None:
        self.store = store
        self.topics = topics
        self.default_queues = default_queues

    # ----------------------------------------------------------------- topics
    async def create_topic(self, topic: str, queues: int = 0, message_type: str = "NORMAL",
                           permission: pb.Permission = pb.READ_WRITE) -> tuple[TopicConfig, bool]:
        """(config, created). The same create twice is fine; a different one
        for an existing topic is refused, so a typo cannot reshape a topic."""
        validation.validate_send_topic(topic)
        wanted = TopicConfig(topic, read_queue_nums=_queue_count(queues or self.default_queues),
                             write_queue_nums=_queue_count(queues or self.default_queues),
                             perm=_perm(permission), attributes={MESSAGE_TYPE_ATTRIBUTE: _type(message_type)})
        existing = self.topics.get(topic)
        if existing is not None:
            if _same_shape(existing, wanted):
                return existing, False
            raise BrokerError(pb.BAD_REQUEST, f"topic {topic!r} exists with {describe(existing)}; "
                                              f"use update to change it to {describe(wanted)}")
        await self.store.update_topic(wanted)
        log.info("admin created topic %s: %s", topic, describe(wanted))
        return self.topics.get(topic) or wanted, True

    async def update_topic(self, topic: str, queues: int | None = None, message_type: str | None = None,
                           permission: pb.Permission | None = None) -> TopicConfig:
        validation.validate_send_topic(topic)
        config = self._topic(topic)
        changes: dict[str, object] = {}
        if queues is not None:
            count = _queue_count(queues)
            current = max(config.read_queue_nums, config.write_queue_nums)
            if count < current:
                raise BrokerError(pb.BAD_REQUEST, f"topic {topic!r} has {current} queues; queues cannot be "
                                                  f"removed (their messages would become unreadable)")
            changes.update(read_queue_nums=count, write_queue_nums=count)
        if message_type is not None:
            changes["attributes"] = {**config.attributes, MESSAGE_TYPE_ATTRIBUTE: _type(message_type)}
        if permission is not None:
            changes["perm"] = _perm(permission)
        updated = config.with_changes(**changes)
        if updated != config:
            await self.store.update_topic(updated)
            log.info("admin updated topic %s: %s", topic, describe(updated))
        return self.topics.get(topic) or updated

    async def delete_topic(self, topic: str) -> None:
        validation.validate_send_topic(topic)
        self._topic(topic)
        await self.store.delete_topic(topic)
        log.info("admin deleted topic %s", topic)

    def list_topics(self, include_system: bool = False) -> list[TopicConfig]:
        configs = sorted(self.store.topics.topics.values(), key=lambda c: c.topic_name)
        return [c for c in configs if include_system or not is_system_topic(c.topic_name)]

    def queue_offsets(self, config: TopicConfig) -> list[tuple[int, int, int]]:
        """(queue id, min offset, max offset) of every queue of a topic."""
        count = max(config.read_queue_nums, config.write_queue_nums)
        name = config.topic_name
        return [(q, self.store.min_offset(name, q), self.store.max_offset(name, q)) for q in range(count)]

    # ----------------------------------------------------------------- groups
    async def create_group(self, group: str, max_retries: int | None = None,
                           fifo: bool = False) -> tuple[SubscriptionGroupConfig, bool]:
        validation.validate_consumer_group(group)
        wanted = SubscriptionGroupConfig(group, retry_max_times=_retries(max_retries),
                                         consume_message_orderly=fifo)
        existing = self.store.groups.get(group)
        if existing is not None:
            if (existing.retry_max_times, existing.consume_message_orderly) == (wanted.retry_max_times, fifo):
                return existing, False
            raise BrokerError(pb.BAD_REQUEST, f"consumer group {group!r} exists with max retries "
                                              f"{existing.retry_max_times}, fifo "
                                              f"{existing.consume_message_orderly}; use update to change it")
        await self.store.update_group(wanted)
        log.info("admin created consumer group %s (max retries %d, fifo %s)", group, wanted.retry_max_times, fifo)
        return self.store.groups.get(group) or wanted, True

    async def update_group(self, group: str, max_retries: int | None = None,
                           fifo: bool | None = None) -> SubscriptionGroupConfig:
        validation.validate_consumer_group(group)
        config = self._group(group)
        updated = SubscriptionGroupConfig.from_json({
            **config.to_json(),
            "retryMaxTimes": config.retry_max_times if max_retries is None else _retries(max_retries),
            "consumeMessageOrderly": config.consume_message_orderly if fifo is None else fifo})
        if updated != config:
            await self.store.update_group(updated)
            log.info("admin updated consumer group %s", group)
        return self.store.groups.get(group) or updated

    def list_groups(self) -> list[SubscriptionGroupConfig]:
        return sorted(self.store.groups.groups.values(), key=lambda g: g.group_name)

    # -------------------------------------------------------------------- lag
    def describe_lag(self, group: str, topic: str = "") -> list[QueueLag]:
        """The group's committed offset against each queue's end: every queue
        of `topic`, or of every topic the group has committed offsets for."""
        validation.validate_consumer_group(group)
        self._group(group)
        if topic:
            validation.validate_topic(topic)
            topics = [self._topic(topic)]
        else:
            suffix = f"@{group}"
            names = sorted(key[:-len(suffix)] for key in self.store.offsets.offsets if key.endswith(suffix))
            topics = [c for c in (self.topics.get(n) for n in names) if c is not None]
        lags = []
        for config in topics:
            for queue_id, low, high in self.queue_offsets(config):
                committed = self.store.offsets.query(group, config.topic_name, queue_id)
                lags.append(QueueLag(config.topic_name, queue_id, -1 if committed is None else committed, low, high))
        return lags

    # ---------------------------------------------------------------- lookups
    def _topic(self, topic: str) -> TopicConfig:
        config = self.topics.get(topic)
        if config is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return config

    def _group(self, group: str) -> SubscriptionGroupConfig:
        config = self.store.groups.get(group)
        if config is None:
            raise BrokerError(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist")
        return config


def describe(config: TopicConfig) -> str:
    return (f"{max(config.read_queue_nums, config.write_queue_nums)} queues, type {config.message_type}, "
            f"permission {pb.Permission.Name(permission_of(config.perm))}")


def _same_shape(a: TopicConfig, b: TopicConfig) -> bool:
    return (a.read_queue_nums, a.write_queue_nums, a.perm, a.message_type) == \
        (b.read_queue_nums, b.write_queue_nums, b.perm, b.message_type)


def _queue_count(count: int) -> int:
    if not 1 <= count <= MAX_QUEUES:
        raise BrokerError(pb.BAD_REQUEST, f"a topic has 1 to {MAX_QUEUES} queues, not {count}")
    return count


def _type(message_type: str) -> str:
    name = message_type.upper()
    if name not in MESSAGE_TYPES:
        raise BrokerError(pb.BAD_REQUEST, f"message type {message_type!r} is not one of {', '.join(MESSAGE_TYPES)}")
    return name


def _perm(permission: pb.Permission) -> int:
    if permission not in PERMISSIONS:
        raise BrokerError(pb.BAD_REQUEST, f"permission {permission} is not one of NONE, READ, WRITE, READ_WRITE")
    return PERMISSIONS[permission]


def _retries(max_retries: int | None) -> int:
    if max_retries is None:
        return DEFAULT_MAX_RETRIES
    if not 0 <= max_retries <= MAX_RETRIES:
        raise BrokerError(pb.BAD_REQUEST, f"max retries must be 0 to {MAX_RETRIES}, not {max_retries}")
    return max_retries
