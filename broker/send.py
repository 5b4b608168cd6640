"""SendMessage: validate, pick queues, store, answer receipts.

The broker picks the queue (the protocol's SendMessage carries none): round
robin over the topic's write queues, or, for a FIFO message, the queue its
message group hashes to, so that one group's messages stay in one queue in
send order. A repeated message id (a producer's retry) is answered with the
original receipt (broker/message_ids.py); while the first attempt is still
being committed, the repeat waits for it.
"""
from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from dataclasses import dataclass
from typing import Sequence

from broker import validation
from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.message_ids import MessageIdTable, StoredMessage
from broker.messages import message_type_of, timestamp_ms, to_stored
from broker.status import ok, status_of
from broker.topics import TopicService
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.codec import MessageExt
from store.message_store import MessageStore
from store.topic_config import TopicConfig


@dataclass
class _Pending:
    """One message of a send request on its way to the store."""
    request_index: int
    message: pb.Message
    stored: MessageExt
    key: tuple[str, str]


class SendService:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicService) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.limits = validation.ValidationLimits(max_body_bytes=config.max_body_size)
        self.recent = MessageIdTable(config.dedupe_capacity)
        store.add_arrival_listener(self.recent.on_arrival)
        self._sending: dict[tuple[str, str], asyncio.Future[StoredMessage]] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def send(self, messages: Sequence[pb.Message]) -> spb.SendMessageResponse:
        if not messages:
            raise BrokerError(pb.BAD_REQUEST, "a send needs at least one message")
        topic = messages[0].topic.name
        if any(m.topic.name != topic for m in messages):
            raise BrokerError(pb.BAD_REQUEST, "every message of one send must go to the same topic")
        validation.validate_send_topic(topic, self.limits)
        for message in messages:
            self.validate(message)
        config = await self.topics.ensure_for_send(topic)
        for message in messages:
            message_type = message_type_of(message)
            self.topics.check_type(config, message_type)
            if message_type in (pb.DELAY, pb.TRANSACTION):
                raise BrokerError(pb.NOT_IMPLEMENTED, f"{pb.MessageType.Name(message_type)} messages are not "
                                                      "served by this broker yet")
        entries = await self._store(config, messages)
        failed = next((entry.status for entry in entries if entry.status.code != pb.OK), None)
        return spb.SendMessageResponse(status=failed or ok(), entries=entries)

    def validate(self, message: pb.Message) -> None:
        system = message.system_properties
        limits = self.limits
        validation.validate_message_id(system.message_id)
        validation.validate_body(message.body, limits)
        if system.HasField("tag"):
            validation.validate_tag(system.tag, limits)
        validation.validate_keys(list(system.keys))
        if system.HasField("message_group"):
            validation.validate_message_group(system.message_group, limits)
        validation.validate_user_properties(message.user_properties, system.tag, list(system.keys), limits)
        validation.validate_message_type(system)
        if system.HasField("delivery_timestamp"):
            validation.validate_delivery_timestamp(timestamp_ms(system.delivery_timestamp),
                                                   int(time.time() * 1000), limits)

    # ------------------------------------------------------------------ store
    async def _store(self, config: TopicConfig, messages: Sequence[pb.Message]) -> list[spb.SendResultEntry]:
        entries: list[spb.SendResultEntry | None] = [None] * len(messages)
        repeats: list[tuple[int, asyncio.Future[StoredMessage]]] = []
        fresh: list[_Pending] = []
        for i, message in enumerate(messages):
            key = (config.topic_name, message.system_properties.message_id)
            known = self.recent.get(*key)
            if known is not None:
                entries[i] = _receipt(message, known)
            elif key in self._sending:
                repeats.append((i, self._sending[key]))
            else:
                fresh.append(_Pending(i, message, to_stored(message, self._queue_for(config, message)), key))
        if fresh:
            await self._put(fresh, entries)
        for i, waiting in repeats:
            try:
                entries[i] = _receipt(messages[i], await asyncio.shield(waiting))
            except Exception as error:  # noqa: BLE001 - the first attempt's failure is this one's too
                entries[i] = spb.SendResultEntry(status=status_of(error),
                                                 message_id=messages[i].system_properties.message_id)
        return [entry for entry in entries if entry is not None]

    async def _put(self, fresh: list[_Pending], entries: list[spb.SendResultEntry | None]) -> None:
        loop = asyncio.get_running_loop()
        futures = {p.key: loop.create_future() for p in fresh}
        self._sending.update(futures)
        try:
            results = await self.store.put_messages([p.stored for p in fresh])
        except Exception as error:  # noqa: BLE001 - every message of the put shares its failure
            for p in fresh:
                futures[p.key].set_exception(error)
                entries[p.request_index] = spb.SendResultEntry(status=status_of(error),
                                                              message_id=p.message.system_properties.message_id)
            for future in futures.values():
                future.exception()  # retrieved: a repeat may never have come to wait on it
            return
        finally:
            for key in futures:
                self._sending.pop(key, None)
        for p, result in zip(fresh, results):
            stored = StoredMessage(result.queue_id, result.queue_offset, result.physical_offset)
            futures[p.key].set_result(stored)
            entries[p.request_index] = _receipt(p.message, stored)

    def _queue_for(self, config: TopicConfig, message: pb.Message) -> int:
        count = config.write_queue_nums
        if count <= 0:
            raise BrokerError(pb.FORBIDDEN, f"topic {config.topic_name!r} has no write queues")
        system = message.system_properties
        if system.HasField("message_group"):
            # Stable across nodes and restarts: one message group, one queue.
            return zlib.crc32(system.message_group.encode("utf-8")) % count
        counter = self._round_robin.setdefault(config.topic_name, itertools.count())
        return next(counter) % count


def _receipt(message: pb.Message, stored: StoredMessage) -> spb.SendResultEntry:
    return spb.SendResultEntry(status=ok(), message_id=message.system_properties.message_id,
                              offset=stored.queue_offset, queue_id=stored.queue_id)
