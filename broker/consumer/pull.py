"""Offset-based consumption: PullMessage, UpdateOffset, GetOffset, QueryOffset.

A pull consumer reads a queue from an offset it chooses and commits its
progress itself; the broker keeps the committed offset in the replicated
consumer offset table. Pulls long-poll like receives. For a group that also
pops, GetOffset answers the pop state's consumed offset and UpdateOffset
resets the pop state too (that is how an offset reset reaches pop consumers).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from broker import validation
from broker.consumer.committer import PopCommitter
from broker.consumer.config import ConsumerConfig
from broker.consumer.long_polling import LongPollingService
from broker.consumer.pop_state import PopStateManager, ResetOp
from broker.consumer.receive import EnsureGroup
from broker.errors import BrokerError
from broker.filter_expression import parse_filter_expression
from broker.messages import timestamp_ms, to_delivered
from broker.topics import TopicService
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store import message_const as mc
from store.consume_queue import GetStatus
from store.message_store import MessageStore
from store.topic_config import TopicConfig

# Non-matching stretches one pull looks through before it answers with the
# offset it got to (a queue full of other tags must not hold the loop).
MAX_FILTERED_SCANS = 16


@dataclass
class PullResult:
    status: pb.Status
    next_offset: int
    messages: list[pb.Message] = field(default_factory=list)


class PullService:
    def __init__(self, config: ConsumerConfig, store: MessageStore, topics: TopicService, state: PopStateManager,
                 committer: PopCommitter, polling: LongPollingService, ensure_group: EnsureGroup) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.state = state
        self.committer = committer
        self.polling = polling
        self.ensure_group = ensure_group

    def _queue(self, queue: pb.MessageQueue) -> TopicConfig:
        topic = queue.topic.name
        validation.validate_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        if not 0 <= queue.id < config.read_queue_nums:
            raise BrokerError(pb.BAD_REQUEST, f"topic {topic!r} has no queue {queue.id} (it has "
                                              f"{config.read_queue_nums} readable queues)")
        return config

    # ----------------------------------------------------------------- pull
    async def pull(self, request: spb.PullMessageRequest, time_remaining: float | None) -> PullResult:
        validation.validate_consumer_group(request.group.name)
        self._queue(request.message_queue)
        topic, queue_id = request.message_queue.topic.name, request.message_queue.id
        if request.offset < 0:
            raise BrokerError(pb.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        if not 0 < request.batch_size <= self.config.max_batch_size:
            raise BrokerError(pb.BAD_REQUEST, f"batch_size {request.batch_size} is outside 1..{self.config.max_batch_size}")
        tag_filter = parse_filter_expression(request.filter_expression.type, request.filter_expression.expression)
        polling = request.long_polling_timeout.ToTimedelta()
        if polling < timedelta(0):
            raise BrokerError(pb.ILLEGAL_POLLING_TIME, f"long polling timeout {polling.total_seconds()} s is negative")
        polling = min(polling, validation.DEFAULT_LIMITS.max_long_polling)
        if time_remaining is not None:
            polling = max(timedelta(0), min(polling, timedelta(seconds=time_remaining) - self.config.deadline_margin))
        await self.ensure_group(request.group.name)
        hashes = None if tag_filter.matches_all else set(tag_filter.tag_hashes)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + polling.total_seconds()
        offset, scans = request.offset, 0
        while True:
            await self.committer.ready()
            waiter = self.polling.register(topic)
            try:
                found = self.store.get_messages(topic, queue_id, offset, request.batch_size, hashes)
                if found.status is GetStatus.OFFSET_TOO_SMALL:
                    raise _illegal_offset(f"offset {offset} of {topic}/{queue_id} is gone (retention); the first "
                                          f"retained offset is {found.next_offset}", found.next_offset)
                if found.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                    raise _illegal_offset(f"offset {offset} of {topic}/{queue_id} is past its end "
                                          f"{found.next_offset}", found.next_offset)
                if found.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                    messages = [to_delivered(m) for m in found.messages if tag_filter.matches(m.properties.get(mc.TAGS))]
                    offset, scans = found.next_offset, scans + 1
                    if messages or scans >= MAX_FILTERED_SCANS:
                        return PullResult(ok_status(), offset, messages)
                    if offset < found.max_offset:
                        continue  # more to look at, no need to wait
                remaining = give_up - loop.time()
                if remaining <= 0:
                    return PullResult(ok_status("no new message"), offset)
                await waiter.wait(min(remaining, self.config.leader_check_interval_s))
            finally:
                waiter.close()
            await asyncio.sleep(0)

    # -------------------------------------------------------------- offsets
    async def update_offset(self, request: spb.UpdateOffsetRequest) -> None:
        group = request.group.name
        validation.validate_consumer_group(group)
        self._queue(request.message_queue)
        topic, queue_id = request.message_queue.topic.name, request.message_queue.id
        end = self.store.max_offset(topic, queue_id)
        if not 0 <= request.offset <= end:
            raise _illegal_offset(f"offset {request.offset} is outside {topic}/{queue_id}'s range 0..{end}", end)
        await self.ensure_group(group)
        await self.committer.ready()
        await self.store.commit_offsets([(group, topic, queue_id, request.offset)])
        if self.state.queue(group, topic, queue_id) is not None:
            await self.committer.commit([ResetOp(group, topic, queue_id, request.offset)])

    async def get_offset(self, request: spb.GetOffsetRequest) -> int:
        group = request.group.name
        validation.validate_consumer_group(group)
        self._queue(request.message_queue)
        topic, queue_id = request.message_queue.topic.name, request.message_queue.id
        popped = self.state.queue(group, topic, queue_id)
        if popped is not None:
            return popped.consumed_offset()
        committed = self.store.offsets.query(group, topic, queue_id)
        if committed is None:
            raise BrokerError(pb.OFFSET_NOT_FOUND, f"group {group!r} has no offset for {topic}/{queue_id}")
        return committed

    def query_offset(self, request: spb.QueryOffsetRequest) -> int:
        self._queue(request.message_queue)
        topic, queue_id = request.message_queue.topic.name, request.message_queue.id
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            return self.store.min_offset(topic, queue_id)
        if policy == pb.END:
            return self.store.max_offset(topic, queue_id)
        if policy == pb.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise BrokerError(pb.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp")
            return self.store.offset_by_time(topic, queue_id, timestamp_ms(request.timestamp))
        raise BrokerError(pb.BAD_REQUEST, f"unknown query_offset_policy {policy}")


class IllegalOffset(BrokerError):
    """ILLEGAL_OFFSET, with the offset to go on from (sent as next_offset)."""

    def __init__(self, message: str, next_offset: int) -> None:
        super().__init__(pb.ILLEGAL_OFFSET, message)
        self.next_offset = next_offset


def _illegal_offset(message: str, next_offset: int) -> IllegalOffset:
    return IllegalOffset(message, next_offset)


def ok_status(message: str = "OK") -> pb.Status:
    return pb.Status(code=pb.OK, message=message)
