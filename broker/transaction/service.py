"""TransactionService: half messages on send, EndTransaction, and (on the
leader) the check-back of undecided ones. See broker/transaction/__init__.py."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import sys
import time
from dataclasses import replace
from typing import AsyncIterator, Callable

from broker import validation
from broker.clients import ClientRegistry, ClientSession
from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.leadership import LeaderGate, TermClaims, nothing_written, wait_ready_term
from broker.messages import to_delivered
from broker.topics import TopicService
from broker.transaction.state import (COMMIT, HALF_TOPIC, ROLLBACK, HalfMessage, TransactionKind,
                                      TransactionState, check_payload, rollback_payload)
from dledger.errors import DLedgerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store import message_const as mc
from store.codec import MessageExt
from store.errors import StoreError
from store.message_id import create_offset_message_id, decode_offset_message_id
from store.message_store import MessageStore
from store.socket_address import SocketAddress

log = logging.getLogger(__name__)

# Half messages checked (or rolled back) per pass of the checker.
CHECK_BATCH = 1000
# The checker looks for due half messages at most this far apart.
MAX_SCAN_S = 1.0
_RESOLUTION_NAMES = {pb.COMMIT: COMMIT, pb.ROLLBACK: ROLLBACK}
# Properties of a half message its committed copy does not carry.
_HALF_ONLY = (mc.REAL_TOPIC, mc.REAL_QUEUE_ID)


def wall_ms() -> int:
    return int(time.time() * 1000)


def transaction_id(store_host: SocketAddress, physical_offset: int) -> str:
    """The half message's offset message id (what RocketMQ calls offsetMsgId)."""
    return create_offset_message_id(store_host, physical_offset)


def half_offset_of(transaction: str) -> int:
    try:
        return decode_offset_message_id(transaction)[1]
    except ValueError:
        raise BrokerError(pb.INVALID_TRANSACTION_ID,
                          f"{transaction!r} is not a transaction id this broker issued") from None


class _KeyedLocks:
    """One asyncio.Lock per key while anyone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[int, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: int) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class _TermDict:
    """A dict valid for one term (TermClaims' shape, with values)."""

    def __init__(self) -> None:
        self.term = -1
        self._items: dict[int, int] = {}

    def for_term(self, term: int) -> dict[int, int]:
        if term != self.term:
            self.term, self._items = term, {}
        return self._items


class TransactionService:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicService, clients: ClientRegistry,
                 gate: LeaderGate, clock: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.clients = clients
        self.gate = gate
        self.clock = clock
        self.state = TransactionState(store.config.config_dir, int(config.transaction_timeout_s * 1000))
        store.add_manager(self.state)
        store.add_arrival_listener(self.state.on_arrival)
        store.server.retention_floors.append(self._retention_floor)
        # Half messages whose commit or rollback this term has written (or is
        # writing): neither another end nor the checker may decide them again.
        self._ending = TermClaims()
        self._locks = _KeyedLocks()
        self._round_robin = itertools.count()
        # Half messages due for a check that no producer could take, and until
        # when this leader leaves them (leader-local, like the claims).
        self._waiting_for_producer = _TermDict()
        self._reported_unasked: set[int] = set()
        self.checks_sent = 0

    def _retention_floor(self) -> int:
        """The log keeps everything from the oldest pending message on."""
        oldest = self.state.oldest_index()
        return sys.maxsize if oldest is None else oldest

    # -------------------------------------------------------------- sending
    def to_half_message(self, stored: MessageExt, message: pb.Message) -> MessageExt:
        """The stored form of a transactional message: a prepared message in
        the half topic, its own topic and queue in properties."""
        properties = stored.properties
        properties[mc.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(self._recovery_s(message, properties))
        properties[mc.TRANSACTION_PREPARED] = "true"
        properties[mc.REAL_TOPIC] = stored.topic
        properties[mc.REAL_QUEUE_ID] = str(stored.queue_id)
        stored.topic, stored.queue_id = HALF_TOPIC, 0
        stored.sys_flag = mc.with_transaction_type(stored.sys_flag, mc.TRANSACTION_PREPARED_TYPE)
        return stored

    def _recovery_s(self, message: pb.Message, properties: dict[str, str]) -> int:
        """Seconds before the first check-back: the producer's
        orphaned_transaction_recovery_duration (or a 4.x producer's
        CHECK_IMMUNITY_TIME_IN_SECONDS property), capped, else the default.
        Rounded up: a sub-second wish must not mean "check at once"."""
        system = message.system_properties
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = system.orphaned_transaction_recovery_duration.ToTimedelta().total_seconds()
        else:
            try:
                seconds = float(properties[mc.CHECK_IMMUNITY_TIME_IN_SECONDS])
            except (KeyError, ValueError):
                seconds = self.config.transaction_timeout_s
        return math.ceil(min(max(seconds, 0.0), self.config.max_transaction_recovery_s))

    async def ensure_topic(self) -> None:
        if self.topics.get(HALF_TOPIC) is None:
            await self.topics.ensure_system(HALF_TOPIC, 1)

    def transaction_id_of(self, physical_offset: int) -> str:
        """The transaction id of a stored half message (for a repeated send)."""
        stored = self.store.read_message(physical_offset)
        host = stored.store_host if stored is not None else self.store.commit_log.store_host
        return transaction_id(host, physical_offset)

    # ------------------------------------------------------- EndTransaction
    async def end(self, request: spb.EndTransactionRequest) -> None:
        topic = request.topic.name
        validation.validate_topic(topic)
        offset = half_offset_of(request.transaction_id)
        wanted = _RESOLUTION_NAMES.get(request.resolution)
        if wanted is None:
            raise BrokerError(pb.BAD_REQUEST, "the resolution must be COMMIT or ROLLBACK (an undecided "
                                              "transaction is simply checked back again later)")
        term = await wait_ready_term(self.gate, self.store.config.ready_wait_s)
        async with self._locks.hold(offset):
            half = self._pending_half(offset, request, wanted)
            if half is None:
                return  # the same end again: answered as the first one was
            reason = "check" if request.source == pb.SOURCE_SERVER_CHECK else "producer"
            await self._decide(half, wanted, reason, term)

    def _pending_half(self, offset: int, request: spb.EndTransactionRequest, wanted: str) -> HalfMessage | None:
        """The undecided half message the request ends; None when it already
        ended the way the request asks; INVALID_TRANSACTION_ID otherwise."""
        half = self.state.get(offset)
        message_id, topic = request.message_id, request.topic.name
        if half is None:
            outcome = self.state.outcome(offset)
            if outcome is not None and outcome.message_id == message_id:
                if outcome.resolution == wanted:
                    return None
                raise BrokerError(pb.INVALID_TRANSACTION_ID, f"transaction {request.transaction_id} was "
                                                             f"already ended: {outcome.resolution} ({outcome.reason})")
            raise BrokerError(pb.INVALID_TRANSACTION_ID, f"no undecided transaction {request.transaction_id} "
                                                         f"with message {message_id!r}")
        if half.message_id != message_id or half.topic != topic:
            raise BrokerError(pb.INVALID_TRANSACTION_ID, f"transaction {request.transaction_id} is message "
                                                         f"{half.message_id} of {half.topic!r}, not {message_id!r} "
                                                         f"of {topic!r}")
        return half

    async def _decide(self, half: HalfMessage, resolution: str, reason: str, term: int) -> None:
        ending = self._ending.for_term(term)
        self._ending.keep_only(self.state.halves)
        if half.offset in ending:
            raise BrokerError(pb.SLAVE_PERSISTENCE_TIMEOUT, f"transaction of message {half.message_id} is being "
                                                            "ended already; retry for its outcome")
        ending.add(half.offset)
        try:
            if resolution == COMMIT:
                await self._commit(half)
            else:
                await self.store.append_system_entry(TransactionKind.ROLLBACK, rollback_payload([half], reason))
        except (StoreError, DLedgerError, BrokerError) as error:
            if nothing_written(error):
                ending.discard(half.offset)
            raise
        # One per transaction: a debug line (a busy producer ends thousands a second).
        log.debug("transaction of %s (%s) ended: %s by %s", half.message_id, half.topic, resolution, reason)

    async def _commit(self, half: HalfMessage) -> None:
        stored = self.store.read_message(half.offset)
        if stored is None:
            raise BrokerError(pb.INTERNAL_SERVER_ERROR, f"half message {half.message_id} is no longer in the "
                                                        "log (retention); it cannot be committed")
        config = self.topics.get(half.topic)
        queues = config.write_queue_nums if config is not None and config.write_queue_nums > 0 else 1
        properties = {k: v for k, v in stored.properties.items() if k not in _HALF_ONLY}
        copy = MessageExt(topic=half.topic, body=stored.body, queue_id=half.queue_id % queues, flag=stored.flag,
                          sys_flag=mc.with_transaction_type(stored.sys_flag, mc.TRANSACTION_COMMIT_TYPE),
                          born_timestamp=stored.born_timestamp, born_host=stored.born_host,
                          reconsume_times=stored.reconsume_times, prepared_transaction_offset=half.offset,
                          properties=properties)
        result = (await self.store.put_messages([copy]))[0]
        # Once applied here, a repeated end reads the outcome instead of waiting on the claim.
        await self.store.wait_applied(result.index, self.store.server.config.max_wait_ack_s)

    # -------------------------------------------------------------- checker
    async def run(self) -> None:
        """The checker: one task on every node, acting while it leads."""
        interval = min(MAX_SCAN_S, self.config.transaction_check_interval_s)
        while True:
            await asyncio.sleep(interval)
            term = self.gate.ready_term()
            if term is None:
                continue
            try:
                await self.check_once(term)
            except (StoreError, DLedgerError) as error:
                log.warning("checking undecided transactions failed (%s: %s); retrying in %.1f s",
                            type(error).__name__, error, interval)

    async def check_once(self, term: int) -> None:
        now = self.clock()
        ending = self._ending.for_term(term)
        self._ending.keep_only(self.state.halves)
        waiting = self._waiting_for_producer.for_term(term)
        for offset, until in list(waiting.items()):
            if until <= now or offset not in self.state.halves:
                del waiting[offset]
        self._reported_unasked = {o for o in self._reported_unasked if o in self.state.halves}
        due = self.state.due_for_check(now, CHECK_BATCH, exclude=ending | waiting.keys())
        expired = [h for h in due if self._expired(h, now)]
        if expired:
            await self._roll_back_expired(expired, ending)
        asked = [(h, p) for h in due if not self._expired(h, now) and (p := self._producer_for(h, now, waiting))]
        if asked:
            # Counted before asked: after a failover the count goes on from
            # here, at worst with one check counted that never arrived.
            interval_ms = int(self.config.transaction_check_interval_s * 1000)
            await self.store.append_system_entry(TransactionKind.CHECK,
                                                 check_payload([h for h, _ in asked], now, interval_ms))
            for half, producer in asked:
                self._ask(half, producer)

    def _expired(self, half: HalfMessage, now_ms: int) -> bool:
        return (half.check_times >= self.config.transaction_check_max
                or now_ms - half.stored_ms >= self.config.transaction_max_lifetime_s * 1000)

    def _producer_for(self, half: HalfMessage, now_ms: int, waiting: dict[int, int]) -> ClientSession | None:
        """A connected producer of the half's topic to ask (round robin). With
        none, the check is not counted: it waits an interval on this leader
        (a producer reconnecting after a failover must not find its
        transactions rolled back for checks it never got)."""
        producers = self.clients.producers_of(half.topic)
        if producers:
            return producers[next(self._round_robin) % len(producers)]
        waiting[half.offset] = now_ms + int(self.config.transaction_check_interval_s * 1000)
        if half.offset not in self._reported_unasked:
            self._reported_unasked.add(half.offset)
            log.info("no producer of %s is connected to check the transaction of %s; waiting for one",
                     half.topic, half.message_id)
        return None

    async def _roll_back_expired(self, expired: list[HalfMessage], ending: set[int]) -> None:
        offsets = [h.offset for h in expired]
        ending.update(offsets)
        try:
            await self.store.append_system_entry(TransactionKind.ROLLBACK, rollback_payload(expired, "unanswered"))
        except (StoreError, DLedgerError) as error:
            if nothing_written(error):
                ending.difference_update(offsets)
            raise
        for half in expired:
            log.warning("transaction of %s (%s) rolled back: still undecided after %d check-backs and %d s",
                        half.message_id, half.topic, half.check_times, (self.clock() - half.stored_ms) // 1000)

    def _ask(self, half: HalfMessage, producer: ClientSession) -> None:
        stored = self.store.read_message(half.offset)
        if stored is None:
            return  # gone with retention: the lifetime limit rolls it back
        real = replace(stored, topic=half.topic, queue_id=half.queue_id,
                       properties={k: v for k, v in stored.properties.items() if k not in _HALF_ONLY})
        command = spb.TelemetryCommand(recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
            message=to_delivered(real), transaction_id=transaction_id(stored.store_host, half.offset)))
        self.clients.push(producer, command)
        self.checks_sent += 1
