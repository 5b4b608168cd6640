"""AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue:
what a consumer does with a message it holds, named by its receipt handle.

A handle is good while it names the message's current lease and that lease
has not expired (RocketMQ's proxy refuses an expired handle too: the message
is about to be, or has been, delivered again). Anything else is
INVALID_RECEIPT_HANDLE with the reason. The change is committed through the
log before the answer, so a new leader honours it.

Every change is a compare-and-set on the lease, so one that lost a race
(a ChangeInvisibleDuration, a redelivery or the move to the dead-letter
queue got there first) is a no-op: each call reads its outcome back from the
pop state before it answers, and answers OK only if its own op took effect
(an ack also if an ack of the same handle's lineage did).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from broker import validation
from broker.consumer.committer import PopCommitter
from broker.consumer.dead_letter import DeadLetter, DeadLetterService
from broker.consumer.pop_state import ACKED, CHANGED, DEAD, DYING, REDELIVERED, AckOp, ChangeOp, Lease, LeaseEnd, PopStateManager
from broker.consumer.receipt import ReceiptHandle, invalid_handle
from broker.consumer.receive import WallClock, wall_clock_ms
from broker.consumer.source import StoreQueueSource
from broker.errors import BrokerError
from broker.status import ok, status_of
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.message_store import MessageStore


class AckService:
    def __init__(self, store: MessageStore, state: PopStateManager, committer: PopCommitter,
                 dead_letters: DeadLetterService, clock: WallClock = wall_clock_ms) -> None:
        self.store = store
        self.state = state
        self.committer = committer
        self.dead_letters = dead_letters
        self.clock = clock
        self.acked = 0

    def current_lease(self, group: str, topic: str, handle: ReceiptHandle, now_ms: int) -> Lease:
        """The lease `handle` names, if it is still the message's and unexpired."""
        lease = self.state.lease_of(group, topic, handle.queue_id, handle.offset)
        if lease is None:
            raise invalid_handle(f"message {topic}/{handle.queue_id}@{handle.offset} is not in flight for group "
                                 f"{group!r}: it was acknowledged or dead-lettered")
        if lease.lease != handle.lease:
            raise invalid_handle("the receipt handle is stale: the message was delivered again or its invisible "
                                 "duration was changed since (use the handle that call returned)")
        if lease.deadline_ms <= now_ms:
            raise invalid_handle(f"the receipt handle expired {(now_ms - lease.deadline_ms) / 1000:.3f} s ago; "
                                 "the message will be delivered again")
        return lease

    # ------------------------------------------------------------------ ack
    async def ack(self, request: spb.AckMessageRequest) -> spb.AckMessageResponse:
        group, topic = _names(request.group.name, request.topic.name)
        entries: Sequence[spb.AckMessageEntry] = request.entries
        if not entries:
            raise BrokerError(pb.BAD_REQUEST, "an ack needs at least one entry")
        await self.committer.ready()
        now = self.clock()
        statuses: list[pb.Status | None] = [None] * len(entries)
        handles: dict[int, ReceiptHandle] = {}
        ops: dict[int, AckOp] = {}
        for i, entry in enumerate(entries):
            try:
                handle = ReceiptHandle.decode(entry.receipt_handle, group, topic)
            except BrokerError as error:
                statuses[i] = error.to_status()
                continue
            try:
                self.current_lease(group, topic, handle, now)
            except BrokerError as error:
                # A retry of an ack that took effect (its answer was lost to a
                # leader change, say) is answered as the first was: OK.
                end = self.state.lease_end(group, topic, handle.queue_id, handle.offset, handle.lease)
                statuses[i] = _OK if end is not None and end.how == ACKED else error.to_status()
                continue
            handles[i] = handle
            ops.setdefault(handle.queue_id, AckOp(group, topic, handle.queue_id, [])).acks.append(
                (handle.offset, handle.lease))
        if ops:
            try:
                await self.committer.commit(list(ops.values()))
            except Exception as error:  # noqa: BLE001 - the entries' statuses carry it
                failure = status_of(error)
                statuses = [failure if status is None else status for status in statuses]
            else:
                for i, handle in handles.items():
                    statuses[i] = self._ack_outcome(group, topic, handle)
                self.acked += sum(status is not None and status.code == pb.OK for status in statuses)
        return _response(entries, statuses)

    def _ack_outcome(self, group: str, topic: str, handle: ReceiptHandle) -> pb.Status:
        """OK if the lease the handle names (or a renewal of it) was ended by
        an ack, this one or an earlier one; else why the ack took no effect."""
        end = self.state.lease_end(group, topic, handle.queue_id, handle.offset, handle.lease)
        if end is not None and end.how == ACKED:
            return _OK
        return invalid_handle(_lost_ack_reason(end)).to_status()

    # ----------------------------------------------- change invisible duration
    async def change_invisible_duration(self, request: spb.ChangeInvisibleDurationRequest
                                        ) -> spb.ChangeInvisibleDurationResponse:
        group, topic = _names(request.group.name, request.topic.name)
        handle = ReceiptHandle.decode(request.receipt_handle, group, topic)
        duration: timedelta = request.invisible_duration.ToTimedelta()
        validation.validate_invisible_duration(duration, for_receive=False)
        await self.committer.ready()
        now = self.clock()
        self.current_lease(group, topic, handle, now)
        deadline = now + int(duration.total_seconds() * 1000)
        index = await self.committer.commit([ChangeOp(group, topic, handle.queue_id, handle.offset, handle.lease,
                                                      deadline)])
        lease = self.state.lease_of(group, topic, handle.queue_id, handle.offset)
        if lease is None or lease.lease != index:
            raise invalid_handle("the message was acknowledged or its lease changed by another call meanwhile")
        renewed = ReceiptHandle(handle.queue_id, handle.offset, index, lease.deadline_ms)
        return spb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=renewed.encode(group, topic))

    # ------------------------------------------------------ dead-letter queue
    async def forward_to_dead_letter_queue(self, request: spb.ForwardMessageToDeadLetterQueueRequest
                                           ) -> spb.ForwardMessageToDeadLetterQueueResponse:
        group, topic = _names(request.group.name, request.topic.name)
        handle = ReceiptHandle.decode(request.receipt_handle, group, topic)
        await self.committer.ready()
        lease = self.current_lease(group, topic, handle, self.clock())
        message = StoreQueueSource(self.store, topic, handle.queue_id).read(handle.offset)
        letter = DeadLetter(handle.queue_id, handle.offset, handle.lease, max(lease.attempt, request.delivery_attempt),
                            message)
        if not await self.dead_letters.forward(group, topic, [letter], "forwarded by the consumer", self.clock()):
            end = self.state.lease_end(group, topic, handle.queue_id, handle.offset, handle.lease)
            raise invalid_handle(f"the lease ended before the message could be moved ({end.how if end else 'reset'})")
        return spb.ForwardMessageToDeadLetterQueueResponse(status=ok())


def _names(group: str, topic: str) -> tuple[str, str]:
    validation.validate_consumer_group(group)
    validation.validate_topic(topic)
    return group, topic


def _lost_ack_reason(end: LeaseEnd | None) -> str:
    if end is not None and end.how == CHANGED:
        return ("the receipt handle was superseded: a ChangeInvisibleDuration on it took effect before this ack, "
                "so the message stays in flight (ack with the handle that call returned)")
    if end is not None and end.how == REDELIVERED:
        return "the receipt handle was superseded: the lease ran out and the message was delivered again first"
    if end is not None and end.how in (DEAD, DYING):
        return "the message was moved to the dead-letter queue before this ack took effect"
    return "the lease ended before this ack took effect (the message was acknowledged, moved, or its offset reset)"


# Shared by the entries of every answer: a Status is copied into the entry
# that is given it, so one instance serves them all (never changed).
_OK = ok()


def _response(entries: Sequence[spb.AckMessageEntry], statuses: list[pb.Status | None]) -> spb.AckMessageResponse:
    """The answer, built in place (an entry per ack entry, in order): handing
    each entry's Status to a constructor copies it, twice per entry."""
    response = spb.AckMessageResponse()
    response.status.CopyFrom(_overall(statuses))
    add = response.entries.add
    for entry, status in zip(entries, statuses):
        result = add(message_id=entry.message_id, receipt_handle=entry.receipt_handle)
        if status is not None:
            result.status.CopyFrom(status)
    return response


def _overall(statuses: Sequence[pb.Status | None]) -> pb.Status:
    """OK when every entry is; the entries' shared status when they agree (a
    one-entry ack, as the official clients send, gets its entry's); else
    MULTIPLE_RESULTS, each entry carrying its own."""
    codes = {status.code for status in statuses if status is not None}
    if codes == {pb.OK}:
        return ok()
    if len(codes) == 1:
        return next(status for status in statuses if status is not None)
    return pb.Status(code=pb.MULTIPLE_RESULTS, message="some entries failed; see each entry's status")
