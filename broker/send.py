"""SendMessage: validate, pick queues, store, answer receipts.

The broker picks the queue (the protocol's SendMessage carries none): round
robin over the topic's write queues, or, for a FIFO message, the queue its
message group hashes to, so that one group's messages stay in one queue in
send order. A repeated message id (a producer's retry) is answered with the
original receipt (broker/message_ids.py); while the first attempt is still
being committed, the repeat waits for it.

Delayed and transactional messages are stored elsewhere first (a timer topic,
the half topic; broker/timer/, broker/transaction/): their receipts carry a
recall handle or a transaction id, a repeat's too.
"""
from __future__ import annotations

import asyncio
import itertools
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

from broker import validation
from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.message_ids import MessageIdTable, StoredMessage
from broker.messages import message_type_of, timestamp_ms, to_stored
from broker.status import ok, status_of
from broker.timer.service import TimerService
from broker.timer.state import TIMER_TOPICS
from broker.topics import TopicService
from broker.transaction.service import TransactionService
from broker.transaction.state import HALF_TOPIC
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.codec import MessageExt
from store.errors import PutOutcomeUnknownError
from store.message_store import MessageStore
from store.topic_config import TopicConfig

# Sends in doubt remembered at most (older terms' are dropped first).
MAX_IN_DOUBT = 100_000


@dataclass(slots=True)
class _Checked:
    """A validated message and what validating it found out, so that storing
    it does not read the protocol message's properties a second time."""
    message: pb.Message
    user_properties: dict[str, str]
    delay_level: int | None
    message_type: int


@dataclass
class _Pending:
    """One message of a send request on its way to the store."""
    request_index: int
    message: pb.Message
    stored: MessageExt
    key: tuple[str, str]


class SendService:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicService, timers: TimerService,
                 transactions: TransactionService) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.timers = timers
        self.transactions = transactions
        self.limits = validation.ValidationLimits(max_body_bytes=config.max_body_size,
                                                  max_delay=timedelta(seconds=config.max_delay_s))
        self.recent = MessageIdTable(config.dedupe_window_entries)
        store.add_arrival_listener(self.recent.on_arrival)
        self._sending: dict[tuple[str, str], asyncio.Future[StoredMessage]] = {}
        # Sends whose put ended with an unknown outcome (written to this
        # leader's log, commit not seen in time), with the term they were
        # written in: a retry in that term must first see whether they committed.
        self._in_doubt: dict[tuple[str, str], int] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def rebuild_recent(self) -> None:
        """At start: read the message ids of the window before the entry the
        store resumes after back from the log (it replays only what follows)."""
        config = self.store.config
        await self.recent.rebuild(self.store.server, self.store.applied_index, config.reput_batch_bytes,
                                  config.legacy_untagged_entries)

    async def send(self, messages: Sequence[pb.Message]) -> spb.SendMessageResponse:
        if not messages:
            raise BrokerError(pb.BAD_REQUEST, "a send needs at least one message")
        topic = messages[0].topic.name
        if any(m.topic.name != topic for m in messages):
            raise BrokerError(pb.BAD_REQUEST, "every message of one send must go to the same topic")
        validation.validate_send_topic(topic, self.limits)
        checked = [self.validate(message) for message in messages]
        config = await self.topics.ensure_for_send(topic)
        for item in checked:
            self.topics.check_type(config, item.message_type)
        entries = await self._store(config, checked)
        failed = next((entry.status for entry in entries if entry.status.code != pb.OK), None)
        return spb.SendMessageResponse(status=failed or ok(), entries=entries)

    def validate(self, message: pb.Message) -> _Checked:
        system = message.system_properties
        limits = self.limits
        validation.validate_message_id(system.message_id)
        validation.validate_body(message.body, limits)
        tag = system.tag
        if tag:
            validation.validate_tag(tag, limits)
        keys = list(system.keys)
        if keys:
            validation.validate_keys(keys)
        if system.message_group:
            validation.validate_message_group(system.message_group, limits)
        # Most messages have no user properties; dict() of a protobuf map
        # walks it through Python's Mapping protocol even when it is empty.
        user = dict(message.user_properties) if message.user_properties else {}
        level_text = user.pop(validation.DELAY_LEVEL_PROPERTY, None)
        validation.validate_user_properties(user, tag, keys, limits)
        level = None
        if level_text is not None:
            level = validation.validate_delay_level(level_text, self.timers.levels.max_level)
            user[validation.DELAY_LEVEL_PROPERTY] = level_text  # stored as sent; the timer sets the level
        validation.validate_message_type(system, has_delay_level=level is not None)
        if system.HasField("delivery_timestamp"):
            validation.validate_delivery_timestamp(timestamp_ms(system.delivery_timestamp),
                                                   self.timers.clock(), limits)
        return _Checked(message, user, level, pb.DELAY if level is not None else message_type_of(message))

    def _stored_form(self, config: TopicConfig, checked: _Checked, now_ms: int) -> MessageExt:
        message = checked.message
        stored = to_stored(message, self._queue_for(config, message), user_properties=checked.user_properties)
        if checked.delay_level is not None or message.system_properties.HasField("delivery_timestamp"):
            return self.timers.to_timer_message(stored, checked.delay_level, now_ms)
        if checked.message_type == pb.TRANSACTION:
            return self.transactions.to_half_message(stored, message)
        return stored

    # ------------------------------------------------------------------ store
    async def _store(self, config: TopicConfig, checked: Sequence[_Checked]) -> list[spb.SendResultEntry]:
        # A new leader knows every message committed before its term only once
        # it has applied them (and, after a start, read the window before its
        # checkpoint back from the log): look the ids up after that, not before.
        await self.store.ready_for_writes()
        await self.recent.rebuilt.wait()
        entries: list[spb.SendResultEntry | None] = [None] * len(checked)
        repeats: list[tuple[int, asyncio.Future[StoredMessage]]] = []
        fresh: list[_Pending] = []
        now = self.timers.clock()
        for i, item in enumerate(checked):
            message = item.message
            message_id = message.system_properties.message_id
            key = (config.topic_name, message_id)
            stored = self._stored_form(config, item, now)
            # A delayed message's first copy may sit in a timer topic while a
            # retry (due by then) would go straight to its topic, or the
            # other way round: look in every place a copy can be.
            places = [stored.topic, config.topic_name]
            if item.delay_level is not None or message.system_properties.HasField("delivery_timestamp"):
                places += sorted(TIMER_TOPICS)
            places = list(dict.fromkeys(places))
            known = self._find(places, message_id)
            if known is None and key in self._in_doubt:
                known = await self._settle_doubt(key, places)
            if known is not None:
                entries[i] = self._receipt(message, known, config.topic_name)
            elif key in self._sending:
                repeats.append((i, self._sending[key]))
            else:
                fresh.append(_Pending(i, message, stored, key))
        if fresh:
            await self._ensure_internal_topics({p.stored.topic for p in fresh})
            await self._put(fresh, entries)
        for i, waiting in repeats:
            try:
                entries[i] = self._receipt(checked[i].message, await asyncio.shield(waiting), config.topic_name)
            except Exception as error:  # noqa: BLE001 - the first attempt's failure is this one's too
                entries[i] = spb.SendResultEntry(status=status_of(error),
                                                 message_id=checked[i].message.system_properties.message_id)
        return [entry for entry in entries if entry is not None]

    def _note_doubt(self, keys: list[tuple[str, str]]) -> None:
        term = self.store.server.member_state.term
        if len(self._in_doubt) > MAX_IN_DOUBT:
            self._in_doubt = {k: t for k, t in self._in_doubt.items() if t == term}
        for key in keys:
            self._in_doubt[key] = term

    def _find(self, places: list[str], message_id: str) -> StoredMessage | None:
        return next((found for found in (self.recent.get(topic, message_id) for topic in places)
                     if found is not None), None)

    async def _settle_doubt(self, key: tuple[str, str], places: list[str]) -> StoredMessage | None:
        """A retry of a send whose first put's outcome was unknown, in the same
        term: its entry, if it was written, lies in this leader's log before
        the log's end now; once everything up to there is applied, the id
        table knows. (A new leader applies all earlier terms' entries before
        it takes a send, so only this term's doubts need the wait.)"""
        term = self._in_doubt.get(key)
        if term != self.store.server.member_state.term:
            self._in_doubt.pop(key, None)
            return None
        end = self.store.server.store.ledger_end_index
        if not await self.store.wait_applied(end, self.store.server.config.max_wait_ack_s):
            raise PutOutcomeUnknownError(f"message {key[1]} was written before and is not known to be committed "
                                         f"yet: retry later (it is not written twice)")
        self._in_doubt.pop(key, None)
        # Every place a copy can be: a delayed message's first attempt may
        # have gone to a timer topic and its retry, due by now, to its topic
        # (a 10-minute chaos run stored one twice so).
        return self._find(places, key[1])

    async def _ensure_internal_topics(self, topics: set[str]) -> None:
        for topic in topics & TIMER_TOPICS:
            await self.timers.ensure_topic(topic)
        if HALF_TOPIC in topics:
            await self.transactions.ensure_topic()

    async def _put(self, fresh: list[_Pending], entries: list[spb.SendResultEntry | None]) -> None:
        """The put runs to its end even when the call that asked for it is
        cancelled (the client's deadline): once written, its outcome must be
        recorded (the id remembered, or the doubt noted), else the client's
        retry in this term would find neither and store the message twice."""
        task = asyncio.ensure_future(self._put_to_end(fresh, entries))
        await asyncio.shield(task)

    async def _put_to_end(self, fresh: list[_Pending], entries: list[spb.SendResultEntry | None]) -> None:
        loop = asyncio.get_running_loop()
        futures = {p.key: loop.create_future() for p in fresh}
        self._sending.update(futures)
        try:
            results = await self.store.put_messages([p.stored for p in fresh])
        except Exception as error:  # noqa: BLE001 - every message of the put shares its failure
            if isinstance(error, PutOutcomeUnknownError):
                self._note_doubt([p.key for p in fresh])
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
            stored = StoredMessage(result.queue_id, result.queue_offset, result.physical_offset, p.stored.topic)
            self.recent.remember(p.key[1], stored)
            futures[p.key].set_result(stored)
            offset_message_id = result.message_id if stored.topic == HALF_TOPIC else None
            entries[p.request_index] = self._receipt(p.message, stored, p.key[0], offset_message_id)

    def _receipt(self, message: pb.Message, stored: StoredMessage, topic: str,
                 offset_message_id: str | None = None) -> spb.SendResultEntry:
        message_id = message.system_properties.message_id
        entry = spb.SendResultEntry(message_id=message_id, offset=max(stored.queue_offset, 0))
        status = entry.status   # set in place: a Status passed to the constructor is copied
        status.code, status.message = pb.OK, "OK"
        if stored.topic == topic:
            # Our extension field (the protocol's receipt has no queue); a
            # timer or a half message has no queue of its topic yet.
            entry.queue_id = stored.queue_id
        if stored.topic in TIMER_TOPICS:
            entry.recall_handle = self.timers.recall_handle(topic, stored.physical_offset, message_id)
        elif stored.topic == HALF_TOPIC:
            entry.transaction_id = offset_message_id or self.transactions.transaction_id_of(stored.physical_offset)
        return entry

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
