"""TimerService: stores delayed messages as timers, recalls them, and (on the
leader) delivers them when due. See broker/timer/__init__.py for the design."""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Awaitable, Callable

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.leadership import LeaderGate, TermClaims, nothing_written, wait_ready_term
from broker.timer.levels import DelayLevels
from broker.timer.recall_handle import RecallHandle
from broker.timer.state import (SCHEDULE_TOPIC, TIMER_TOPIC, Timer, TimerKind, TimerState,
                                cancel_payload)
from broker.topics import TopicService
from dledger.errors import DLedgerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store import message_const as mc
from store.codec import DispatchRequest, MessageExt
from store.errors import StoreError
from store.message_store import MessageStore

log = logging.getLogger(__name__)

# The deliverer looks again at least this often (leadership may have come or
# gone); a new timer due sooner wakes it at once.
MAX_SLEEP_S = 0.25
# After a failed delivery, before the next try: keeps a broken store from
# turning the loop into a busy one (and its log into a flood).
RETRY_S = 0.5
# Properties of a timer message that its delivered copy does not carry.
_TIMER_ONLY = (mc.REAL_TOPIC, mc.REAL_QUEUE_ID, mc.DELAY_TIME_LEVEL)


def wall_ms() -> int:
    return int(time.time() * 1000)


class TimerService:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicService, gate: LeaderGate,
                 clock: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.gate = gate
        self.clock = clock
        self.levels = DelayLevels.parse(config.message_delay_level)
        self.state = TimerState(store.config.config_dir, self.levels)
        store.add_manager(self.state)
        store.add_arrival_listener(self._on_arrival)
        store.server.retention_floors.append(self._retention_floor)
        self._delivering = TermClaims()
        self._recalling = TermClaims()
        self._wake = asyncio.Event()
        self.delivered = 0

    def _retention_floor(self) -> int:
        """The log keeps everything from the oldest pending message on."""
        oldest = self.state.oldest_index()
        return sys.maxsize if oldest is None else oldest

    def _on_arrival(self, request: DispatchRequest, index: int) -> None:
        if self.state.on_arrival(request, index):
            self._wake.set()

    # ------------------------------------------------------------- sending
    def to_timer_message(self, stored: MessageExt, level: int | None, now_ms: int) -> MessageExt:
        """The stored form of a delayed message: in the schedule topic for a
        level, in the timer topic for a delivery time; unchanged (its own
        topic, visible at once) when that time has already come."""
        properties = stored.properties
        if level is not None:
            level = self.levels.clamp(level)
            due, topic, queue_id = now_ms + self.levels.delay_ms(level), SCHEDULE_TOPIC, level - 1
            properties[mc.DELAY_TIME_LEVEL] = str(level)
        else:
            due, topic, queue_id = int(properties[mc.TIMER_DELIVER_MS]), TIMER_TOPIC, 0
            if due <= now_ms:
                return stored
        properties[mc.TIMER_DELIVER_MS] = str(due)
        properties[mc.REAL_TOPIC] = stored.topic
        properties[mc.REAL_QUEUE_ID] = str(stored.queue_id)
        stored.topic, stored.queue_id = topic, queue_id
        return stored

    async def ensure_topic(self, topic: str) -> None:
        """Create a timer topic the first time it is written (one queue per level)."""
        if self.topics.get(topic) is None:
            await self.topics.ensure_system(topic, self.levels.max_level if topic == SCHEDULE_TOPIC else 1)

    @staticmethod
    def recall_handle(topic: str, physical_offset: int, message_id: str) -> str:
        return RecallHandle(topic, physical_offset, message_id).encode()

    # -------------------------------------------------------------- recall
    async def recall(self, topic: str, handle: str) -> str:
        """Cancel a timer not yet delivered; returns its message id."""
        recall = RecallHandle.decode(handle)
        if recall.topic != topic:
            raise BrokerError(pb.BAD_REQUEST, f"the recall handle is for topic {recall.topic!r}, not {topic!r}")
        term = await wait_ready_term(self.gate, self.store.config.ready_wait_s)
        recalling = self._recalling.for_term(term)
        self._recalling.keep_only(self.state.pending)
        timer = self.state.get(recall.physical_offset)
        if timer is None or timer.message_id != recall.message_id:
            raise BrokerError(pb.NOT_FOUND, f"message {recall.message_id} of {topic!r} is not waiting for its "
                                            "delivery time: it was delivered or recalled already")
        if timer.offset in recalling:
            raise BrokerError(pb.SLAVE_PERSISTENCE_TIMEOUT, f"an earlier recall of {recall.message_id} is "
                                                            "still being replicated; retry")
        if timer.offset in self._delivering.for_term(term):
            raise BrokerError(pb.NOT_FOUND, f"message {recall.message_id} is due and being delivered")
        recalling.add(timer.offset)
        try:
            await self.store.append_system_entry(TimerKind.CANCEL, cancel_payload([timer], "recall"))
        except (StoreError, DLedgerError) as error:
            if nothing_written(error):
                recalling.discard(timer.offset)
            raise
        log.info("recalled timed message %s of %s (due %d)", timer.message_id, timer.topic, timer.due_ms)
        return timer.message_id

    # ----------------------------------------------------------- delivering
    async def run(self) -> None:
        """The deliverer: one task on every node, acting while it leads."""
        while True:
            # Cleared before looking, so a timer that arrives while we look wakes the sleep below.
            self._wake.clear()
            term = self.gate.ready_term()
            if term is None:
                await self._sleep(MAX_SLEEP_S)
                continue
            delivering = self._delivering.for_term(term)
            self._delivering.keep_only(self.state.pending)
            busy = delivering | self._recalling.for_term(term)
            due = self.state.due(self.clock(), self.config.timer_batch_size, exclude=busy)
            if not due:
                await self._sleep_until(self.state.next_due_ms(), bool(busy))
                continue
            try:
                await self._deliver(due, delivering)
            except (StoreError, DLedgerError) as error:
                log.warning("delivering %d due timers failed (%s: %s); retrying in %.1f s",
                            len(due), type(error).__name__, error, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _deliver(self, due: list[Timer], delivering: set[int]) -> None:
        now = self.clock()
        copies: list[MessageExt] = []
        gone: list[Timer] = []
        for timer in due:
            copy = self._copy_of(timer)
            if copy is None:
                gone.append(timer)
            else:
                copies.append(copy)
        if gone:
            await self._claimed(delivering, gone, self.store.append_system_entry(
                TimerKind.CANCEL, cancel_payload(gone, "gone")))
        if copies:
            await self._claimed(delivering, [t for t in due if t not in gone], self.store.put_messages(copies))
        self.delivered += len(copies)
        late = now - due[0].due_ms
        if late > 1000:
            log.warning("delivered %d timers, the earliest %d ms after its due time", len(copies), late)

    @staticmethod
    async def _claimed(delivering: set[int], timers: list[Timer], write: Awaitable[object]) -> None:
        """Run `write` with its timers claimed; a failure that wrote nothing
        frees them for another try, one whose outcome is unknown keeps them
        until the log tells (the write lands unless the term ends)."""
        offsets = [timer.offset for timer in timers]
        delivering.update(offsets)
        try:
            await write
        except (StoreError, DLedgerError) as error:
            if nothing_written(error):
                delivering.difference_update(offsets)
            raise

    def _copy_of(self, timer: Timer) -> MessageExt | None:
        """The message as its consumers get it, or None (and a log line) when
        its topic or the stored timer message no longer exists."""
        config = self.topics.get(timer.topic)
        stored = self.store.read_message(timer.offset)
        if config is None or config.write_queue_nums <= 0 or stored is None:
            log.warning("timer %s for %s/%d dropped: %s", timer.message_id, timer.topic, timer.queue_id,
                        "its topic is gone" if stored is not None else "the stored message is gone")
            return None
        properties = {k: v for k, v in stored.properties.items() if k not in _TIMER_ONLY}
        properties[mc.TIMER_DELIVER_MS] = str(timer.due_ms)
        properties[mc.TIMER_ORIGIN_OFFSET] = str(timer.offset)
        # A topic shrunk since the send keeps its messages in its remaining queues.
        return MessageExt(topic=timer.topic, body=stored.body, queue_id=timer.queue_id % config.write_queue_nums,
                          flag=stored.flag, sys_flag=stored.sys_flag, born_timestamp=stored.born_timestamp,
                          born_host=stored.born_host, reconsume_times=stored.reconsume_times,
                          properties=properties)

    async def _sleep_until(self, due_ms: int | None, busy: bool) -> None:
        if due_ms is None:
            await self._sleep(MAX_SLEEP_S)
            return
        wait = (due_ms - self.clock()) / 1000
        # Due but all busy (an outcome still unknown): look again soon, not at once.
        await self._sleep(min(max(wait, 0.05 if busy else 0.0), MAX_SLEEP_S))

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
