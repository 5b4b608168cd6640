"""ReceiveMessage: pop messages for a consumer group, long polling when there
are none.

One receive looks at the topic's readable queues in turn, starting with the
one the client named (the official clients round-robin over queues; popping
is balanced by message, so any consumer may be served from any queue), and
decides per queue what to deliver (selection.py). The decisions become pop
ops, committed through the log (committer.py) before a single message is
returned: a message is never in a client's hands without its lease being
replicated. Ops that lost a race by the time they were applied deliver
nothing; the client gets the rest.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Awaitable, Callable

from broker import validation
from broker.consumer.committer import ClaimTable, PopCommitter
from broker.consumer.config import ConsumerConfig
from broker.consumer.long_polling import LongPollingService
from broker.consumer.pop_state import CHANGED, ChangeOp, Lease, PopStateManager
from broker.consumer.receipt import ReceiptHandle
from broker.consumer.selection import Request, Selection, message_group_of, select
from broker.consumer.source import StoreQueueSource, initial_offset
from broker.errors import BrokerError
from broker.filter_expression import TagFilter, parse_filter_expression
from broker.messages import to_delivered
from broker.topics import TopicService
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig
from store.topic_config import PERM_READ

log = logging.getLogger(__name__)

WallClock = Callable[[], int]  # ms since the epoch
EnsureGroup = Callable[[str], Awaitable[SubscriptionGroupConfig]]
MakeMessage = Callable[[], pb.Message]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def max_attempts(group: SubscriptionGroupConfig) -> int:
    """Deliveries before the dead-letter queue: the first plus retry_max_times
    retries, as RocketMQ counts them (16 retries: 17 deliveries)."""
    return group.retry_max_times + 1


@dataclass(frozen=True)
class ReceiveParams:
    group: str
    topic: str
    queue_id: int
    batch: int
    invisible: timedelta
    polling: timedelta
    tag_filter: TagFilter
    attempt_id: str | None


class ReceiveService:
    def __init__(self, config: ConsumerConfig, store: MessageStore, topics: TopicService, state: PopStateManager,
                 committer: PopCommitter, claims: ClaimTable, polling: LongPollingService, ensure_group: EnsureGroup,
                 clock: WallClock = wall_clock_ms) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.state = state
        self.committer = committer
        self.claims = claims
        self.polling = polling
        self.ensure_group = ensure_group
        self.clock = clock
        self.received = 0
        # Receives by attempt id whose pop entry is being committed here.
        self._attempts_in_flight: dict[tuple[str, str], asyncio.Future[int]] = {}

    # ------------------------------------------------------------ requests
    def params(self, request: spb.ReceiveMessageRequest, time_remaining: float | None,
               request_timeout: timedelta, held: bool = False) -> ReceiveParams:
        """Check a request; BrokerError with the protocol's code when it is bad.
        `held`: its deadline was checked where it entered the cluster
        (validation.check_polling_deadline) and it was held or forwarded
        since: a deadline now under the minimum long poll shortens the poll."""
        group = request.group.name
        validation.validate_consumer_group(group)
        topic = request.message_queue.topic.name
        validation.validate_topic(topic)
        tag_filter = parse_filter_expression(request.filter_expression.type, request.filter_expression.expression)
        limit = self.config.max_batched_receive_size if request.batched_response else self.config.max_batch_size
        if not 0 < request.batch_size <= limit:
            raise BrokerError(pb.BAD_REQUEST, f"batch_size {request.batch_size} is outside 1..{limit}")
        if request.HasField("invisible_duration"):
            invisible = request.invisible_duration.ToTimedelta()
            validation.validate_invisible_duration(invisible, for_receive=True)
        elif request.auto_renew:
            invisible = self.config.default_invisible_duration
        else:
            raise BrokerError(pb.ILLEGAL_INVISIBLE_TIME, "the request names no invisible duration; a simple "
                                                         "consumer must choose one")
        remaining = timedelta(seconds=time_remaining) if time_remaining is not None else None
        requested = request.long_polling_timeout.ToTimedelta() if request.HasField("long_polling_timeout") else None
        polling = validation.effective_long_polling_timeout(requested, remaining, request_timeout, held=held)
        if remaining is not None:
            # Answer before the client's deadline, with room for the answer to travel.
            polling = max(timedelta(0), min(polling, remaining - self.config.deadline_margin))
        return ReceiveParams(group, topic, request.message_queue.id, request.batch_size, invisible, polling,
                             tag_filter, request.attempt_id if request.HasField("attempt_id") else None)

    async def receive(self, params: ReceiveParams, stop_waiting: Callable[[], bool] | None = None,
                      make: MakeMessage = pb.Message) -> list[pb.Message]:
        """Messages for the group, waiting up to the polling time for some
        (or until `stop_waiting()` says so, checked whenever it wakes).
        `make()` gives each delivered message its (empty) protocol message:
        a response's new element, so the answer holds it without a copy."""
        config = self.topics.get(params.topic)
        if config is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {params.topic!r} does not exist")
        if not config.perm & PERM_READ or config.read_queue_nums <= 0:
            raise BrokerError(pb.FORBIDDEN, f"topic {params.topic!r} is not readable")
        group = await self.ensure_group(params.group)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + params.polling.total_seconds()
        if params.attempt_id is not None:
            again = await self._repeat_when_settled(params, make)
            if again:
                return again
        while True:
            await self.committer.ready()
            waiter = self.polling.register(params.topic)
            try:
                messages = await self._pop_once(params, group, config.read_queue_nums, make)
                if messages:
                    self.received += len(messages)
                    return messages
                remaining = give_up - loop.time()
                if remaining <= 0 or (stop_waiting is not None and stop_waiting()):
                    return []
                await waiter.wait(min(remaining, self._until_next_deadline(params),
                                      self.config.leader_check_interval_s))
            finally:
                waiter.close()

    def _until_next_deadline(self, params: ReceiveParams) -> float:
        deadline = self.state.next_deadline(params.group, params.topic)
        if deadline is None:
            return float("inf")
        return max(0.0, (deadline - self.clock()) / 1000)

    # -------------------------------------------------------------- popping
    async def _pop_once(self, params: ReceiveParams, group: SubscriptionGroupConfig, queues: int,
                        make: MakeMessage) -> list[pb.Message]:
        now = self.clock()
        deadline = now + int(params.invisible.total_seconds() * 1000)
        fifo = group.consume_message_orderly
        selections: list[Selection] = []
        wanted = params.batch
        first = params.queue_id % queues if params.queue_id >= 0 else 0
        for i in range(queues):
            queue_id = (first + i) % queues
            request = Request(params.group, params.topic, queue_id, wanted, deadline, now, max_attempts(group),
                              params.tag_filter, fifo, self.config.fifo_scan_extra, self.config.fifo_max_blocked,
                              params.attempt_id)
            key = (params.group, params.topic, queue_id)
            queue = self.state.queues.get(key)
            start = initial_offset(self.store, params.group, params.topic, queue_id) if queue is None else 0
            selection = select(request, queue, start, self.claims.get(key), StoreQueueSource(self.store, params.topic,
                                                                                           queue_id))
            if selection.changes_state:
                selections.append(selection)
                wanted -= len(selection.deliveries)
                if wanted <= 0:
                    break
        if not selections:
            return []
        committing = self._commit(selections)
        if params.attempt_id is not None:
            # Known as in flight until its entry is in, even when this call is
            # cancelled meanwhile (a client that timed out retries at once).
            key = (params.group, params.attempt_id)
            self._attempts_in_flight[key] = committing
            committing.add_done_callback(lambda done: self._attempt_settled(key, done))
        index = await asyncio.shield(committing)
        return self._delivered(params, selections, index, make)

    def _attempt_settled(self, key: tuple[str, str], done: asyncio.Future[int]) -> None:
        if self._attempts_in_flight.get(key) is done:
            del self._attempts_in_flight[key]

    def _commit(self, selections: list[Selection]) -> asyncio.Future[int]:
        """The selections' ops queued for the log, their claims held from now
        (before any other receive selects) until the entry is applied or the
        append fails, whether or not the receive still waits."""
        held = []
        for selection in selections:
            op = selection.op
            key = (op.group, op.topic, op.queue_id)
            # FIFO: the message groups this receive delivers or holds back are
            # held for concurrent receives until its entry is applied.
            groups = [] if op.new_groups is None else \
                [message_group_of(d.message) for d in selection.deliveries] + [g for _, g in op.blocked]
            offsets = [d.offset for d in selection.deliveries] + [offset for offset, _ in op.filtered]
            claim = (key, op.end if op.scans else None, offsets, groups)
            self.claims.hold(*claim)
            held.append(claim)
        committing = self.committer.submit([s.op for s in selections])

        def release(_: asyncio.Future[int]) -> None:
            for claim in held:
                self.claims.release(*claim)
        committing.add_done_callback(release)
        return committing

    def _delivered(self, params: ReceiveParams, selections: list[Selection], index: int,
                   make: MakeMessage) -> list[pb.Message]:
        """The messages whose lease this entry granted (a decision that lost a
        race by the time it was applied delivers nothing)."""
        messages = []
        for selection in selections:
            queue_id = selection.op.queue_id
            for delivery in selection.deliveries:
                lease = self.state.lease_of(params.group, params.topic, queue_id, delivery.offset)
                if lease is None or lease.lease != index:
                    continue
                handle = ReceiptHandle(queue_id, delivery.offset, index, lease.deadline_ms)
                messages.append(to_delivered(delivery.message, receipt_handle=handle.encode(params.group, params.topic),
                                             delivery_attempt=lease.attempt, invisible_duration=params.invisible,
                                             into=make()))
        return messages

    async def _repeat_when_settled(self, params: ReceiveParams, make: MakeMessage) -> list[pb.Message]:
        """The batch an earlier try of this receive was given, once whatever
        that try may have written is known: this node has applied the log
        up to the start of its term (a lease the previous leader wrote and
        this one committed), and a try still committing here has finished.
        Looked up any earlier, the lease is missed, the retry is handed
        other messages, and the first batch's attempt is spent unseen."""
        assert params.attempt_id is not None
        await self.committer.ready()
        committing = self._attempts_in_flight.get((params.group, params.attempt_id))
        if committing is not None:
            await asyncio.wait([committing])   # its failure is its own caller's
        return await self._repeat(params, make)

    async def _repeat(self, params: ReceiveParams, make: MakeMessage) -> list[pb.Message]:
        """A retried receive (same attempt id) gets the batch it was given,
        as far as those leases still stand. A lease that ran out while the
        first answer was lost (the leader died holding it, and the retry
        came after the failover) is still that receive's while nothing else
        took the message: it is renewed for the retry, in the log as a
        ChangeInvisibleDuration would be, so the consumer sees the attempt
        it was counted for. Handed out unrenewed it would be redelivered
        under the consumer's feet; left to run out, its message came back
        as the next attempt, or went to the dead-letter queue after one
        fewer delivery than the group allows (a 10-minute chaos run's
        dlq_early: attempt 3 of 3 leased by a leader killed before it
        answered, the retry 12 s later past the 10 s lease). A lease an
        earlier retry renewed counts as the batch's too: that retry's answer
        may have been lost as well."""
        assert params.attempt_id is not None
        recent = self.state.recent_receive(params.group, params.attempt_id)
        if recent is None or recent.topic != params.topic:
            return []
        now = self.clock()
        leases: dict[tuple[int, int], Lease] = {}
        for queue_id, offset in recent.offsets:
            lease = self.state.lease_of(params.group, params.topic, queue_id, offset)
            if lease is not None and self._still_of_batch(params, queue_id, offset, recent.index, lease.lease):
                leases[queue_id, offset] = lease
        lapsed = {place: lease.lease for place, lease in leases.items() if lease.deadline_ms <= now}
        if lapsed:
            leases.update(await self._renew(params, lapsed))
        now = self.clock()
        messages = []
        for (queue_id, offset), lease in leases.items():   # the batch's order (FIFO: its group's)
            if lease.deadline_ms <= now:
                continue   # lapsed, and taken by another op before it was renewed
            stored = StoreQueueSource(self.store, params.topic, queue_id).read(offset)
            if stored is None:
                continue
            handle = ReceiptHandle(queue_id, offset, lease.lease, lease.deadline_ms)
            remaining = timedelta(milliseconds=lease.deadline_ms - now)   # positive: lapsed ones are skipped
            messages.append(to_delivered(stored, receipt_handle=handle.encode(params.group, params.topic),
                                         delivery_attempt=lease.attempt, invisible_duration=remaining, into=make()))
        return messages

    def _still_of_batch(self, params: ReceiveParams, queue_id: int, offset: int, batch_lease: int,
                        current: int) -> bool:
        """The current lease is the one the batch granted, or a renewal of
        it (a retry before this one renewed it, and that retry's answer was
        lost too)."""
        if current == batch_lease:
            return True
        end = self.state.lease_end(params.group, params.topic, queue_id, offset, batch_lease)
        return end is not None and end.how == CHANGED and end.successor == current

    async def _renew(self, params: ReceiveParams, lapsed: dict[tuple[int, int], int]
                     ) -> dict[tuple[int, int], Lease]:
        """New leases, for the retry's invisible duration, on the lapsed
        leases of a repeated batch; those another op ended first (a
        redelivery, the dead-letter queue) are left out."""
        deadline = self.clock() + int(params.invisible.total_seconds() * 1000)
        index = await self.committer.commit([ChangeOp(params.group, params.topic, queue_id, offset, lease_id, deadline)
                                             for (queue_id, offset), lease_id in lapsed.items()])
        renewed = {}
        for queue_id, offset in lapsed:
            lease = self.state.lease_of(params.group, params.topic, queue_id, offset)
            if lease is not None and lease.lease == index:
                renewed[queue_id, offset] = lease
        return renewed
