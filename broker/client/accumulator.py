"""SendAccumulator: concurrent sends leave together in shared SendMessage calls.

Python gRPC costs about as much per call as per kilobyte, so one message per
call caps a producer at a few thousand messages a second. As a Kafka
producer batches records, the accumulator lets at most `max_inflight` calls
fly; sends that arrive meanwhile queue up and leave together in the next call
(up to `max_messages` and `max_bytes`, one topic per call, as the protocol
requires). Sends linger for the rest of the event-loop turn they were made in
(as the log client's appends do, dledger/client.py): concurrent senders woken
together by one call's answer send again in the same turn, and without the
linger the first few of them would each take a call of its own (measured
with 128 concurrent single sends: 569 calls of 1 message for 139 of 124).
A lone send waits for no clock, only for the turn to end; a full batch
leaves at once. What is queued is spread over the free calls, none under
`min_call_messages` (MIN_CALL_MESSAGES), so that a wave of senders keeps a
couple of calls in flight (the broker works on one while the other is
replicated) instead of one call that everybody waits for.

Order within a message group (FIFO) survives batching: a group's messages
leave in send order, and a group never has two calls in flight, so a retried
call cannot be overtaken by a later one of the same group (Kafka's
max.in.flight=1, per group rather than per connection). The messages of one
`send_batch` without a group are ordered the same way (a BatchOrder is their
key), and a call takes the whole batch at the head of the queue when it
fits: a batch is stored in the order given, as RocketMQ stores a
MessageBatch, in one call when it fits; concurrent batches still spread
over the free calls.
Spread over parallel calls, a batch's later part was stored first now and
then (tests/integration/test_client_producer.py).
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from broker.client.errors import ClientError
from broker.client.message import SendReceipt
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

# A call carries at least this many messages when the queue is spread over
# several calls (fewer only when fewer are queued).
MIN_CALL_MESSAGES = 64

# What sends one call's messages: a receipt or an error per message, in order.
SendCall = Callable[[str, list[pb.Message]], Awaitable[Sequence[SendReceipt | ClientError]]]


class BatchOrder:
    """The ordering key of one send_batch call's messages that have no group."""
    __slots__ = ()


@dataclass
class PendingSend:
    topic: str
    message: pb.Message
    size: int
    # What orders it: its message group, the batch it came in, or None (it
    # may overtake and be overtaken).
    group: str | BatchOrder | None
    future: asyncio.Future[SendReceipt] = field(repr=False)


class SendAccumulator:
    def __init__(self, send_call: SendCall, max_inflight: int, max_messages: int, max_bytes: int,
                 min_call_messages: int = MIN_CALL_MESSAGES) -> None:
        self.send_call = send_call
        self.min_call_messages = min_call_messages
        self.max_inflight = max_inflight
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._queue: deque[PendingSend] = deque()
        self._inflight = 0
        self._groups_in_flight: set[str | BatchOrder] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._queued_bytes = 0   # of what is in _queue (its length is the message count)
        self._linger: asyncio.Handle | None = None

    def add(self, sends: Sequence[PendingSend]) -> None:
        """Queue sends (in order) and start calls while there is room; sends
        added together are never split by this call's own start."""
        self._queue.extend(sends)
        self._queued_bytes += sum(pending.size for pending in sends)
        self._idle.clear()
        if len(self._queue) >= self.max_messages or self._queued_bytes >= self.max_bytes:
            self._drain()
        elif self._linger is None:
            self._linger = asyncio.get_running_loop().call_soon(self._linger_over)

    async def flush(self) -> None:
        """Wait until every queued send is answered."""
        await self._idle.wait()

    async def close(self, error: ClientError) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(error)
        self._queued_bytes = 0
        self._idle.set()

    # ------------------------------------------------------------ batching
    def _linger_over(self) -> None:
        self._linger = None
        self._drain()

    def _drain(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            free = self.max_inflight - self._inflight
            share = max(self.min_call_messages, -(-len(self._queue) // free))
            # A batch's calls go one after another, so a call takes the whole
            # batch at the head of the queue when it fits.
            batch = self._take(min(max(share, self._head_batch()), self.max_messages))
            if not batch:
                return  # everything queued waits for a group in flight
            self._inflight += 1
            self._queued_bytes -= sum(pending.size for pending in batch)
            for pending in batch:
                if pending.group is not None:
                    self._groups_in_flight.add(pending.group)
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not self._queue and self._inflight == 0:
            self._idle.set()

    def _head_batch(self) -> int:
        """How many sends of the batch at the head of the queue follow it
        (0 when the head is no batch's), counted up to max_messages."""
        head = self._queue[0].group
        if not isinstance(head, BatchOrder):
            return 0
        count = 0
        for pending in self._queue:
            if pending.group is not head or count == self.max_messages:
                break
            count += 1
        return count

    def _take(self, limit: int) -> list[PendingSend]:
        """The next call's sends (at most `limit`): the first send that may
        leave, then every later one of its topic that fits, skipping (and keeping in order)
        those whose group is busy or was skipped."""
        batch: list[PendingSend] = []
        kept: deque[PendingSend] = deque()
        blocked: set[str | BatchOrder] = set(self._groups_in_flight)
        topic: str | None = None
        size = 0
        while self._queue:
            pending = self._queue.popleft()
            fits = (len(batch) < limit and (not batch or size + pending.size <= self.max_bytes))
            eligible = (pending.group is None or pending.group not in blocked) and \
                (topic is None or pending.topic == topic)
            if eligible and fits:
                topic = pending.topic
                batch.append(pending)
                size += pending.size
                continue
            kept.append(pending)
            if pending.group is not None:
                blocked.add(pending.group)  # its later messages must wait behind it
            if len(batch) >= limit:
                break
        kept.extend(self._queue)
        self._queue = kept
        return batch

    async def _send(self, batch: list[PendingSend]) -> None:
        try:
            try:
                results = await self.send_call(batch[0].topic, [p.message for p in batch])
            except ClientError as error:
                results = [error] * len(batch)
            except Exception as error:  # noqa: BLE001 - handed to every waiting sender
                failure = ClientError(pb.INTERNAL_ERROR, f"send failed: {type(error).__name__}: {error}")
                results = [failure] * len(batch)
            for pending, result in zip(batch, results):
                if pending.future.done():
                    continue
                if isinstance(result, ClientError):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)
        finally:
            self._inflight -= 1
            for pending in batch:
                if pending.group is not None:
                    self._groups_in_flight.discard(pending.group)
            self._drain()
