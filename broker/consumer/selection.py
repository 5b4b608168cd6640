"""What a receive delivers from one queue: the leader's decision, as a pure
function of the pop state, the time, what is already claimed by receives
whose entries are not applied yet, and the queue's messages.

Order of preference: expired leases first (a redelivery, attempt raised),
then, for FIFO groups, messages held back earlier, then new messages from the
frontier. Messages whose lease ran out after the group's last attempt are left
to the revive service, which moves them to the dead-letter queue.

FIFO groups (consume_message_orderly): a message group with a live lease, or
one of whose messages is skipped in this decision, is held: none of its later
messages is delivered (new ones are recorded as blocked), so one message
group has one batch in flight at a time and a redelivered message goes before
everything behind it.

A message that no longer matches the group's filter (the subscription
changed while it was in flight or held back) is filtered out, as a message
that does not match is when first scanned: its expired lease is ended
without a delivery (`filtered`), a held-back one dropped, so it does not
hold the group's consumed offset down. The leader decides with the filter of
the receive at hand, and the decision is an op in the log like any other,
so every replica ends the same leases. A lease that has not expired is left
to its consumer.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from broker.consumer.pop_state import ATTEMPT, DEADLINE, GROUP, LEASE_ID, PopOp, PopQueue
from broker.filter_expression import TagFilter
from store import message_const as mc
from store.codec import MessageExt


# Expired leases one receive may end as filtered out; the rest wait for the
# next (a backlog of them would make one huge entry and one long stall).
FILTERED_PER_RECEIVE = 1000
# Expired leases one receive takes off the deadline heap (in deadline order);
# a backlog is sorted out a slice per receive (and per revive), not at once.
EXPIRED_PER_RECEIVE = 1000


class MessageSource(Protocol):
    """A queue's messages, as the store holds them."""

    def read(self, offset: int) -> MessageExt | None:
        """The message at a queue offset (None when retention removed it)."""

    def scan(self, start: int, max_count: int, tag_hashes: set[int] | None) -> tuple[list[MessageExt], int]:
        """Messages from `start` (those whose tag hash is wanted, when given)
        and the offset after the last unit looked at."""


@dataclass
class QueueClaims:
    """What receives in flight (entries appended, not yet applied) took from
    one queue: the next scan starts after theirs; their offsets and, for FIFO,
    their message groups are not handed out again meanwhile."""
    frontier: int | None = None
    scans: int = 0
    offsets: set[int] = field(default_factory=set)
    groups: Counter[str] = field(default_factory=Counter)


@dataclass
class Delivery:
    offset: int
    message: MessageExt
    attempt: int


@dataclass
class Selection:
    op: PopOp
    deliveries: list[Delivery]

    @property
    def changes_state(self) -> bool:
        op = self.op
        return bool(op.scans or op.redo or op.unblock or op.dropped or op.filtered)


@dataclass(frozen=True)
class Request:
    group: str
    topic: str
    queue_id: int
    batch: int
    deadline_ms: int
    now_ms: int
    max_attempts: int
    tag_filter: TagFilter
    fifo: bool = False
    # FIFO: how many messages beyond the batch one decision may look at, and
    # how many blocked messages a queue may hold (past that, the scan waits).
    fifo_scan_extra: int = 64
    fifo_max_blocked: int = 2000
    attempt_id: str | None = None


def message_group_of(message: MessageExt) -> str:
    return message.properties.get(mc.MESSAGE_GROUP, "")


def select(request: Request, queue: PopQueue | None, start_offset: int, claims: QueueClaims | None,
           source: MessageSource) -> Selection:
    """Decide what to deliver from one queue. `start_offset` is where a
    queue the group has never popped starts."""
    claims = claims or QueueClaims()
    start = claims.frontier if claims.frontier is not None else (queue.pop_offset if queue else start_offset)
    op = PopOp(request.group, request.topic, request.queue_id, request.deadline_ms, start, start,
               new_groups=[] if request.fifo else None, attempt_id=request.attempt_id,
               initial=start_offset if queue is None else None)
    selection = Selection(op, [])
    if request.fifo:
        _select_fifo(request, queue, claims, source, selection)
    else:
        _select_concurrent(request, queue, claims, source, selection)
    return selection


def _select_concurrent(request: Request, queue: PopQueue | None, claims: QueueClaims, source: MessageSource,
                       selection: Selection) -> None:
    op, deliveries = selection.op, selection.deliveries
    if queue is not None:
        # Longest expired first: the dict is in (deadline, offset) order
        # already. Sorting it by offset cost every receive O(n log n) in the
        # expired leases, while a backlog of them waits to be redelivered.
        # Those out of attempts are not in it: they wait for the revive.
        gone = []
        expired = queue.expired(request.now_ms, request.max_attempts, limit=EXPIRED_PER_RECEIVE)
        for offset, lease in expired.items():
            if len(deliveries) >= request.batch or len(op.filtered) >= FILTERED_PER_RECEIVE:
                break
            if offset in claims.offsets or lease[ATTEMPT] >= request.max_attempts:
                continue
            message = source.read(offset)
            if message is None:
                gone.append(offset)
                continue
            if not request.tag_filter.matches(message.properties.get(mc.TAGS)):
                op.filtered.append((offset, lease[LEASE_ID]))
                continue
            op.redo.append((offset, lease[LEASE_ID], lease[ATTEMPT] + 1))
            deliveries.append(Delivery(offset, message, lease[ATTEMPT] + 1))
        for offset in gone:
            queue.set_aside(offset)  # retention removed it: the revive service ends its lease
    wanted = request.batch - len(deliveries)
    if wanted <= 0:
        return
    hashes = None if request.tag_filter.matches_all else set(request.tag_filter.tag_hashes)
    messages, op.end = source.scan(op.start, wanted, hashes)
    for message in messages:
        # Hashes collide: the tag itself decides. A mismatch is skipped for good.
        if request.tag_filter.matches(message.properties.get(mc.TAGS)):
            op.new.append(message.queue_offset)
            deliveries.append(Delivery(message.queue_offset, message, 1))


def _select_fifo(request: Request, queue: PopQueue | None, claims: QueueClaims, source: MessageSource,
                 selection: Selection) -> None:
    op, deliveries = selection.op, selection.deliveries
    held = {group for group, count in claims.groups.items() if count > 0}
    blocked_count = 0
    if queue is not None:
        held.update(lease[GROUP] or "" for lease in queue.in_flight.values()
                    if lease[DEADLINE] > request.now_ms)
        _select_fifo_below_frontier(request, queue, claims, source, selection, held)
        blocked_count = len(queue.blocked)
    if len(deliveries) >= request.batch or blocked_count >= request.fifo_max_blocked:
        return
    hashes = None if request.tag_filter.matches_all else set(request.tag_filter.tag_hashes)
    messages, scan_end = source.scan(op.start, request.batch - len(deliveries) + request.fifo_scan_extra, hashes)
    op.end = scan_end
    assert op.new_groups is not None
    for message in messages:
        offset = message.queue_offset
        if len(deliveries) >= request.batch or blocked_count >= request.fifo_max_blocked:
            op.end = offset  # not looked at: the next scan starts here
            return
        if not request.tag_filter.matches(message.properties.get(mc.TAGS)):
            continue
        group = message_group_of(message)
        if group in held:
            op.blocked.append((offset, group))
            blocked_count += 1
            continue
        op.new.append(offset)
        op.new_groups.append(group)
        deliveries.append(Delivery(offset, message, 1))


def _select_fifo_below_frontier(request: Request, queue: PopQueue, claims: QueueClaims, source: MessageSource,
                                selection: Selection, held: set[str]) -> None:
    """Expired leases and blocked messages, in queue order, one message group
    at a time: the first of a group that cannot go holds the rest."""
    op, deliveries = selection.op, selection.deliveries
    expired = queue.all_expired(request.now_ms, request.max_attempts)
    for offset in sorted(expired.keys() | queue.blocked.keys()):
        lease = expired.get(offset)
        group = (lease[GROUP] or "") if lease is not None else queue.blocked[offset]
        if group in held:
            continue
        if offset in claims.offsets or len(deliveries) >= request.batch or \
                (lease is not None and lease[ATTEMPT] >= request.max_attempts):
            held.add(group)
            continue
        message = source.read(offset)
        if message is None:
            if lease is None:
                op.dropped.append(offset)  # never delivered, and gone with retention: nothing holds the group
            else:
                held.add(group)  # the revive service ends the lease of a message that is gone
            continue
        if not request.tag_filter.matches(message.properties.get(mc.TAGS)):
            # Filtered out now: it holds neither its message group nor the queue.
            if lease is None:
                op.dropped.append(offset)
            elif len(op.filtered) < FILTERED_PER_RECEIVE:
                op.filtered.append((offset, lease[LEASE_ID]))
            else:
                held.add(group)
            continue
        if lease is not None:
            op.redo.append((offset, lease[LEASE_ID], lease[ATTEMPT] + 1))
            deliveries.append(Delivery(offset, message, lease[ATTEMPT] + 1))
        else:
            op.unblock.append(offset)
            deliveries.append(Delivery(offset, message, 1))
