"""PopState: which messages each consumer group has in flight, replicated.

RocketMQ 5 consumes by "pop": a receive hands out messages under an
invisibility lease, an ack ends the lease, an expired lease makes the message
deliverable again with its attempt raised. RocketMQ keeps that bookkeeping
(pop checkpoints, ack markers) on one broker and loses or repeats some of it
when the broker changes; here it is a state machine fed by POP_OPS system
entries in log order on every replica, so a new leader knows exactly which
messages are in flight, until when, under which lease, and which are acked.

Per (consumer group, topic, queue id), a PopQueue holds:

    pop_offset   the scan frontier: every offset below it was delivered at
                 least once or skipped (its tag did not match), unless blocked
    in_flight    offset -> Lease (lease id, deadline, attempt, message group):
                 delivered and not yet acked
    blocked      FIFO groups only: offset -> message group, scanned but held
                 back because an earlier message of its group was in flight

Everything below min(in_flight, blocked, pop_offset) is consumed: that is the
group's consumer offset.

A lease id is the index of the entry that granted it, the same on every
replica; receipt handles carry it. Every op is a compare-and-set, so a
decision the leader took on a view that was stale by the time its entry was
applied (another receive raced it, an ack crossed an expiry, a new leader had
not applied everything) is a no-op on every replica alike:

    pop     new deliveries take effect only if the op's scan starts at
            pop_offset (pop_offset then moves to the scan's end); a
            redelivery only if the offset is still leased under the lease it
            expired under; a blocked offset only while it is blocked
    ack     ends the lease only if it is still the one named
    change  moves the deadline (a new lease id) only if the lease is the one named
    dying   the first step of a move to the dead-letter queue: replaces the
            lease named (if current) by one that is expired and out of
            attempts, so an ack and the move cannot both win
    dead    like ack, on the dying lease: the message went to the dead-letter queue
    (a pop's `filtered` ends expired leases like an ack: see selection.py)
    reset   sets the frontier, dropping the queue's leases and blocked offsets
    resend  an operator's resend of a consumed message: an expired lease on
            it (attempt 0), so the next receive delivers it again; only if
            it lies below the frontier and is neither leased nor blocked

The leader reads the outcome back (`lease_of`) before it answers a client.
Deadlines are wall-clock milliseconds chosen by the leader and stored in the
op, so applying never reads a clock.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from store.captured_dict import Captures, DictCapture
from store.slices import map_in_slices
from store.config_manager import Capture, ConfigManager
from store.packed_columns import pack_ints, pack_json, unpack_ints, unpack_json
from store.recent_map import RecentMap
from store.system_entry import SystemKind

log = logging.getLogger(__name__)

# System entry kinds 100..119 are the consumer's; 100 carries every pop op.
POP_OPS_KIND = SystemKind.BROKER_BASE
# Receives remembered by attempt id (a retried receive gets the same batch back).
ATTEMPT_CACHE_SIZE = 10_000
# Ended leases remembered with how they ended: an ack reads back whether it
# was its own op that ended the lease. Far more than the leases a few entries
# in flight can end (at most 1,000 ops of 32 messages each per entry).
ENDED_LEASES_KEPT = 100_000

# How a lease stopped being current (LeaseEnd.how).
ACKED = "acked"
DEAD = "dead-lettered"
CHANGED = "changed"              # ChangeInvisibleDuration: the successor carries on the handle's lineage
REDELIVERED = "redelivered"
FILTERED = "filtered"            # the message no longer matches the group's filter
DYING = "dying"                  # claimed for the dead-letter queue; the successor is ended by a dead op

QueueKey = tuple[str, str, int]  # consumer group, topic, queue id
ReleaseListener = Callable[[str, str], None]  # (group, topic): messages may have become deliverable


class Lease(NamedTuple):
    """A lease as `lease_of` hands it out. The state holds each one as a
    plain tuple of these fields in this order (LeaseRow, read with the
    indexes below), not as an object: a plain tuple of ints and strs is
    left alone by the garbage collector once it has looked at it, while an
    object is walked by every full collection, on the event loop, where a
    leader's heartbeats wait for it. A million leases in flight cost each
    collection 136-141 ms of CPU as slotted objects, 24-30 ms as rows (the
    rest is the deadline heap's list); tests/unit/test_pop_state.py checks
    that the rows go untracked. Replaced, never changed in place: a
    snapshot copies only the dicts that hold leases."""
    lease: int                 # index of the entry that granted it
    deadline_ms: int           # wall clock: invisible until then
    attempt: int               # delivery attempt, 1 on first delivery
    message_group: str | None = None  # FIFO groups: the message's group ("" when it has none)


LeaseRow = tuple[int, int, int, "str | None"]   # Lease's fields, as the state holds them
LEASE_ID, DEADLINE, ATTEMPT, GROUP = 0, 1, 2, 3


class PopQueue:
    """One (group, topic, queue)'s pop state; see the module doc."""

    __slots__ = ("pop_offset", "in_flight", "blocked", "_deadlines", "_expired", "_exhausted", "_max_attempts",
                 "_lease_captures", "_blocked_captures")

    def __init__(self, pop_offset: int) -> None:
        self.pop_offset = pop_offset
        self.in_flight: dict[int, LeaseRow] = {}
        self.blocked: dict[int, str] = {}
        # Captures of the two dicts begun and not yet copied; see begin_capture.
        self._lease_captures = Captures()
        self._blocked_captures = Captures()
        # Derived, not replicated: a heap of (deadline, offset, lease) with
        # stale entries skipped lazily, and the leases found expired so far,
        # in the order found, split into those a receive may deliver again
        # and those out of attempts (or whose message retention removed),
        # which only the revive service ends. Split by the group's last
        # attempt as of the last look (`_max_attempts`).
        self._deadlines: list[tuple[int, int, int]] = []
        self._expired: dict[int, LeaseRow] = {}
        self._exhausted: dict[int, LeaseRow] = {}
        self._max_attempts = 0

    def consumed_offset(self) -> int:
        lowest = self.pop_offset
        if self.in_flight:
            lowest = min(lowest, min(self.in_flight))
        if self.blocked:
            lowest = min(lowest, min(self.blocked))
        return lowest

    def resendable(self, offset: int) -> bool:
        """Whether a resend of `offset` takes effect: it was delivered (or
        skipped) and is neither leased nor blocked now."""
        return offset < self.pop_offset and offset not in self.in_flight and offset not in self.blocked

    # -------------------------------------------------------------- changes
    def grant(self, offset: int, lease: LeaseRow) -> None:
        if self._lease_captures:
            self._lease_captures.before_change(offset)
        self.in_flight[offset] = lease
        self._expired.pop(offset, None)
        self._exhausted.pop(offset, None)
        heapq.heappush(self._deadlines, (lease[DEADLINE], offset, lease[LEASE_ID]))
        # Acked leases leave their heap entries behind until their deadline;
        # rebuild before they outnumber the live ones (an ack-heavy queue with
        # long leases would otherwise keep every lease it ever granted).
        if len(self._deadlines) > 2 * len(self.in_flight) + 1024:
            self._deadlines = [(row[DEADLINE], o, row[LEASE_ID]) for o, row in self.in_flight.items()]
            heapq.heapify(self._deadlines)

    def restore(self, in_flight: dict[int, LeaseRow], in_worker: bool = False) -> None:
        """Replace the leases (from a file or a metadata snapshot) at once:
        one heapify instead of a push per lease, except in a worker thread,
        where one heapify of a million would hold the GIL (and so the event
        loop) for 50-200 ms, and a push per lease lets it run between them."""
        self._lease_captures.clear()   # they hold the old dict, which nothing changes any more
        self.in_flight = in_flight
        self._expired, self._exhausted = {}, {}
        deadlines = [(lease[DEADLINE], offset, lease[LEASE_ID]) for offset, lease in in_flight.items()]
        if in_worker:
            self._deadlines = []
            for item in deadlines:
                heapq.heappush(self._deadlines, item)
        else:
            heapq.heapify(deadlines)
            self._deadlines = deadlines

    def release(self, offset: int, lease_id: int) -> LeaseRow | None:
        """End the lease if it is still `lease_id`; returns it, or None."""
        lease = self.in_flight.get(offset)
        if lease is None or lease[LEASE_ID] != lease_id:
            return None
        if self._lease_captures:
            self._lease_captures.before_change(offset)
        del self.in_flight[offset]
        self._expired.pop(offset, None)
        self._exhausted.pop(offset, None)
        return lease

    def block(self, offset: int, message_group: str) -> None:
        if self._blocked_captures:
            self._blocked_captures.before_change(offset)
        self.blocked[offset] = message_group

    def unblock(self, offset: int) -> str | None:
        """Let a blocked offset go; its message group, or None if it was not blocked."""
        if offset not in self.blocked:
            return None
        if self._blocked_captures:
            self._blocked_captures.before_change(offset)
        return self.blocked.pop(offset)

    # ------------------------------------------------------------ captures
    def begin_capture(self) -> QueueCapture:
        """The queue as of now, copied later (maybe in a worker thread) while
        it goes on changing: O(1) here (store/captured_dict.py)."""
        return QueueCapture(self.pop_offset, self._lease_captures.begin(self.in_flight),
                            self._blocked_captures.begin(self.blocked))

    # ------------------------------------------------------------- queries
    def expired(self, now_ms: int, max_attempts: int, first_retained: int = 0,
                limit: int | None = None) -> dict[int, LeaseRow]:
        """Expired leases a receive may deliver again (offset -> lease), in
        the order found, as far as `find_expired` got."""
        self.find_expired(now_ms, max_attempts, first_retained, limit)
        return self._expired

    def exhausted(self, now_ms: int, max_attempts: int, first_retained: int = 0,
                  limit: int | None = None) -> dict[int, LeaseRow]:
        """Expired leases out of attempts, or whose message is gone: for the
        revive service, as far as `find_expired` got."""
        self.find_expired(now_ms, max_attempts, first_retained, limit)
        return self._exhausted

    def find_expired(self, now_ms: int, max_attempts: int, first_retained: int = 0, limit: int | None = None) -> int:
        """Take leases past their deadline as of `now_ms` off the heap, at
        most `limit` (longest expired first), sorting each into deliverable
        or exhausted. Returns how many heap entries it looked at."""
        if max_attempts != self._max_attempts:
            self._resort(max_attempts)
        heap, in_flight = self._deadlines, self.in_flight
        looked = 0
        while heap and heap[0][0] <= now_ms and (limit is None or looked < limit):
            deadline, offset, lease_id = heapq.heappop(heap)
            looked += 1
            lease = in_flight.get(offset)
            if lease is not None and lease[LEASE_ID] == lease_id:
                if lease[ATTEMPT] >= max_attempts or offset < first_retained:
                    self._exhausted[offset] = lease
                else:
                    self._expired[offset] = lease
        return looked

    def all_expired(self, now_ms: int, max_attempts: int) -> dict[int, LeaseRow]:
        """Every expired lease, deliverable or not (FIFO: queue order decides)."""
        self.find_expired(now_ms, max_attempts)
        return {**self._expired, **self._exhausted}

    def set_aside(self, offset: int) -> None:
        """An expired lease whose message is gone (retention): for the revive service."""
        lease = self._expired.pop(offset, None)
        if lease is not None:
            self._exhausted[offset] = lease

    def _resort(self, max_attempts: int) -> None:
        """The group's last attempt changed (or this is the first look): the
        split of the leases found so far changes with it (rare; O(found))."""
        found = {**self._expired, **self._exhausted}
        self._expired = {o: lease for o, lease in found.items() if lease[ATTEMPT] < max_attempts}
        self._exhausted = {o: lease for o, lease in found.items() if lease[ATTEMPT] >= max_attempts}
        self._max_attempts = max_attempts

    def next_deadline(self) -> int | None:
        """The earliest deadline of a lease not yet found expired."""
        heap = self._deadlines
        while heap:
            deadline, offset, lease_id = heap[0]
            lease = self.in_flight.get(offset)
            if lease is not None and lease[LEASE_ID] == lease_id:
                return deadline
            heapq.heappop(heap)
        return None


@dataclass(slots=True)
class QueueCapture:
    """One queue as of `begin_capture`: its frontier, and its leases and
    blocked offsets to be copied (`read`, once, maybe in a worker thread)."""
    pop_offset: int
    in_flight: DictCapture[int, LeaseRow]
    blocked: DictCapture[int, str]

    def read(self) -> tuple[int, list[int], list[LeaseRow], dict[int, str]]:
        """(pop offset, the leased offsets in order, their leases, blocked offsets)."""
        offsets, leases = self.in_flight.sorted_items()
        return self.pop_offset, offsets, leases, self.blocked.copy()


# ===================================================================== ops


@dataclass
class PopOp:
    """A receive on one queue: a scan of new messages [start, end) with those
    delivered and those blocked, plus redeliveries of expired leases and
    deliveries of blocked messages, all under one deadline."""
    group: str
    topic: str
    queue_id: int
    deadline_ms: int
    start: int
    end: int
    new: list[int] = field(default_factory=list)
    new_groups: list[str] | None = None          # FIFO: message group of each of `new`
    blocked: list[tuple[int, str]] = field(default_factory=list)
    redo: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, expired lease, attempt now)
    unblock: list[int] = field(default_factory=list)
    # Blocked offsets let go: retention removed the message, or it no longer matches the filter.
    dropped: list[int] = field(default_factory=list)
    # (offset, expired lease): ended without a delivery, because the message
    # does not match the group's filter any more (see selection.py)
    filtered: list[tuple[int, int]] = field(default_factory=list)
    attempt_id: str | None = None
    # Where the group starts on a queue it never popped (the leader decided
    # with no state for it); the scan must still start there to count.
    initial: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"op": "pop", "group": self.group, "topic": self.topic, "queue": self.queue_id,
                                "deadline": self.deadline_ms, "start": self.start, "end": self.end}
        if self.new:
            data["new"] = self.new
        if self.new_groups is not None:
            data["newGroups"] = self.new_groups
        if self.blocked:
            data["blocked"] = [list(b) for b in self.blocked]
        if self.redo:
            data["redo"] = [list(r) for r in self.redo]
        if self.unblock:
            data["unblock"] = self.unblock
        if self.dropped:
            data["dropped"] = self.dropped
        if self.filtered:
            data["filtered"] = [list(f) for f in self.filtered]
        if self.attempt_id is not None:
            data["attemptId"] = self.attempt_id
        if self.initial is not None:
            data["initial"] = self.initial
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PopOp:
        return cls(data["group"], data["topic"], int(data["queue"]), int(data["deadline"]), int(data["start"]),
                   int(data["end"]), [int(o) for o in data.get("new", ())], data.get("newGroups"),
                   [(int(o), str(g)) for o, g in data.get("blocked", ())],
                   [(int(o), int(l), int(a)) for o, l, a in data.get("redo", ())],
                   [int(o) for o in data.get("unblock", ())], [int(o) for o in data.get("dropped", ())],
                   [(int(o), int(l)) for o, l in data.get("filtered", ())],
                   data.get("attemptId"), int(data["initial"]) if "initial" in data else None)

    @property
    def scans(self) -> bool:
        return self.end != self.start or bool(self.new) or bool(self.blocked)


@dataclass
class AckOp:
    """Acks (or, with dead=True, dead-letterings) of leases on one queue."""
    group: str
    topic: str
    queue_id: int
    acks: list[tuple[int, int]]        # (offset, lease)
    dead: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"op": "dead" if self.dead else "ack", "group": self.group, "topic": self.topic,
                "queue": self.queue_id, "acks": [list(a) for a in self.acks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AckOp:
        return cls(data["group"], data["topic"], int(data["queue"]),
                   [(int(o), int(l)) for o, l in data["acks"]], data["op"] == "dead")


@dataclass
class ChangeOp:
    """ChangeInvisibleDuration: the lease on `offset` is replaced by one
    (this entry's index) ending at `deadline_ms`."""
    group: str
    topic: str
    queue_id: int
    offset: int
    lease: int
    deadline_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"op": "change", "group": self.group, "topic": self.topic, "queue": self.queue_id,
                "offset": self.offset, "lease": self.lease, "deadline": self.deadline_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeOp:
        return cls(data["group"], data["topic"], int(data["queue"]), int(data["offset"]), int(data["lease"]),
                   int(data["deadline"]))


@dataclass
class DyingOp:
    """Claim leases for the dead-letter queue, before the copy is written:
    each (offset, lease, attempt) whose lease is still current is replaced by
    this entry's, ending at `deadline_ms` (now: it is expired) with `attempt`
    (at least the group's last: no receive delivers it again). An ack with
    the older handle then does nothing, and the copy is written only for the
    leases this op took. A leader that fails before the `dead` op leaves the
    message leased expired and out of attempts, so the next leader's revive
    moves it (a second copy at worst, never a lost message)."""
    group: str
    topic: str
    queue_id: int
    deadline_ms: int
    claims: list[tuple[int, int, int]]   # (offset, lease, attempt)

    def to_json(self) -> dict[str, Any]:
        return {"op": "dying", "group": self.group, "topic": self.topic, "queue": self.queue_id,
                "deadline": self.deadline_ms, "claims": [list(c) for c in self.claims]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DyingOp:
        return cls(data["group"], data["topic"], int(data["queue"]), int(data["deadline"]),
                   [(int(o), int(l), int(a)) for o, l, a in data["claims"]])


@dataclass
class ResetOp:
    """Start the queue over at `offset` (UpdateOffset, an offset reset)."""
    group: str
    topic: str
    queue_id: int
    offset: int

    def to_json(self) -> dict[str, Any]:
        return {"op": "reset", "group": self.group, "topic": self.topic, "queue": self.queue_id,
                "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResetOp:
        return cls(data["group"], data["topic"], int(data["queue"]), int(data["offset"]))


@dataclass
class ResendOp:
    """Deliver a consumed message once more (an operator's resend): see
    `PopQueue.resendable`. `message_group` is the message's group in a FIFO
    consumer group (None otherwise); `initial` is where the group starts on
    a queue it never popped, as in PopOp."""
    group: str
    topic: str
    queue_id: int
    offset: int
    message_group: str | None = None
    initial: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"op": "resend", "group": self.group, "topic": self.topic, "queue": self.queue_id,
                                "offset": self.offset}
        if self.message_group is not None:
            data["messageGroup"] = self.message_group
        if self.initial is not None:
            data["initial"] = self.initial
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResendOp:
        return cls(data["group"], data["topic"], int(data["queue"]), int(data["offset"]), data.get("messageGroup"),
                   int(data["initial"]) if "initial" in data else None)


Op = PopOp | AckOp | ChangeOp | DyingOp | ResetOp | ResendOp
_DECODERS: dict[str, Callable[[dict[str, Any]], Op]] = {
    "pop": PopOp.from_json, "ack": AckOp.from_json, "dead": AckOp.from_json,
    "change": ChangeOp.from_json, "dying": DyingOp.from_json, "reset": ResetOp.from_json,
    "resend": ResendOp.from_json}


def ops_payload(ops: list[Op]) -> dict[str, Any]:
    return {"ops": [op.to_json() for op in ops]}


def decode_op(data: dict[str, Any]) -> Op:
    return _DECODERS[data["op"]](data)


# ================================================================ manager


class LeaseEnd(NamedTuple):
    """How a lease ended, and the lease that replaced it if one did."""
    how: str
    successor: int | None = None


Run = tuple[int, int, int]   # (queue id, first offset, how many offsets in a row)


class RecentReceive(NamedTuple):
    """What a receive with an attempt id got: a retry with the same id gets it again.

    Its offsets are kept as runs, as a receive takes them: a batch of 32 from
    one queue is one run. Every state file holds the last ATTEMPT_CACHE_SIZE
    of these, so each node writes them every few seconds: as (queue, offset)
    pairs a write took 560-780 ms of GIL-holding work and 3.7 MB for 10,000
    receives of 32, as runs 27-40 ms and 430 KB."""
    index: int
    topic: str
    runs: tuple[Run, ...]

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """(queue id, offset) for each message the receive got, in its order."""
        return [(queue_id, first + k) for queue_id, first, count in self.runs for k in range(count)]


def to_runs(offsets: Iterable[tuple[int, int]]) -> tuple[Run, ...]:
    runs: list[Run] = []
    for queue_id, offset in offsets:
        if runs:
            last_queue, first, count = runs[-1]
            if last_queue == queue_id and first + count == offset:
                runs[-1] = (queue_id, first, count + 1)
                continue
        runs.append((queue_id, offset, 1))
    return tuple(runs)


@dataclass
class _Restore:
    """A metadata snapshot's pop state being built in a worker thread, and
    the entries applied meanwhile, waiting in log order (index, payload)."""
    data: dict[str, Any]
    future: asyncio.Future[_State]
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class PopStateManager(ConfigManager):
    """Applies POP_OPS entries; snapshotted to popState.json."""

    file_name = "popState.json"
    kinds = frozenset({POP_OPS_KIND})
    snapshot_on_change = False     # changes with every receive and ack
    indent = None

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.queues: dict[QueueKey, PopQueue] = {}
        self._by_subscription: dict[tuple[str, str], dict[int, PopQueue]] = {}
        self.release_listeners: list[ReleaseListener] = []
        self._recent: OrderedDict[tuple[str, str], RecentReceive] = OrderedDict()
        # Derived from the ops applied, not snapshotted: only read back by the
        # leader right after its own entry is applied (see lease_end).
        # (how, successor) of recently ended leases: plain tuples in a
        # RecentMap, which the garbage collector does not walk.
        self._ended: RecentMap[tuple[QueueKey, int, int], tuple[str, int | None]] = RecentMap(ENDED_LEASES_KEPT)
        self._restore: _Restore | None = None

    # ------------------------------------------------------------- queries
    def queue(self, group: str, topic: str, queue_id: int) -> PopQueue | None:
        return self.queues.get((group, topic, queue_id))

    def queues_of(self, group: str, topic: str) -> dict[int, PopQueue]:
        return self._by_subscription.get((group, topic), {})

    def lease_of(self, group: str, topic: str, queue_id: int, offset: int) -> Lease | None:
        queue = self.queues.get((group, topic, queue_id))
        row = queue.in_flight.get(offset) if queue is not None else None
        return Lease._make(row) if row is not None else None

    def lease_end(self, group: str, topic: str, queue_id: int, offset: int, lease: int) -> LeaseEnd | None:
        """How `lease` ended, following its renewals by ChangeInvisibleDuration
        (the lineage of one receipt handle): the last renewal's end, or a
        CHANGED end whose successor is still current. None when the lease is
        current or ended too long ago to be remembered."""
        key = (group, topic, queue_id)
        end = self._ended.get((key, offset, lease))
        while end is not None and end[0] == CHANGED and end[1] is not None:
            renewed = self._ended.get((key, offset, end[1]))
            if renewed is None:
                break
            end = renewed
        return LeaseEnd(*end) if end is not None else None

    def next_deadline(self, group: str, topic: str) -> int | None:
        deadlines = [d for q in self.queues_of(group, topic).values() if (d := q.next_deadline()) is not None]
        return min(deadlines, default=None)

    def recent_receive(self, group: str, attempt_id: str) -> RecentReceive | None:
        return self._recent.get((group, attempt_id))

    def __iter__(self) -> Iterator[tuple[QueueKey, PopQueue]]:
        return iter(list(self.queues.items()))

    # ------------------------------------------------------------ applying
    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        # The lease ids are entry indexes: the ops need the entry's index.
        if self._restore is not None:
            self._restore.pending.append((self.applying_index, payload))
            return
        self._apply_payload(self.applying_index, payload)

    def _apply_payload(self, index: int, payload: dict[str, Any]) -> None:
        released: set[tuple[str, str]] = set()
        for data in payload["ops"]:
            op = decode_op(data)
            if self.apply_op(index, op):
                released.add((op.group, op.topic))
        for group, topic in released:
            for listener in self.release_listeners:
                listener(group, topic)

    def apply_op(self, index: int, op: Op) -> bool:
        """Apply one op of entry `index`; True when it may have made messages
        deliverable (a FIFO lease ended, a lease moved or was reset)."""
        if isinstance(op, PopOp):
            self._apply_pop(index, op)
            return False
        if isinstance(op, AckOp):
            key = (op.group, op.topic, op.queue_id)
            queue = self.queues.get(key)
            if queue is None:
                return False
            end = LeaseEnd(DEAD if op.dead else ACKED)
            unblocks = False
            for offset, lease_id in op.acks:
                lease = queue.release(offset, lease_id)
                if lease is not None:
                    self._record_end(key, offset, lease_id, end)
                    # Only a FIFO lease (it names its message group) holds
                    # other messages back. Ending a concurrent one makes
                    # nothing deliverable: waking every waiting receive for
                    # it cost the leader a scan of every queue per ack (the
                    # official clients ack one message a call).
                    unblocks = unblocks or lease[GROUP] is not None
            return unblocks
        if isinstance(op, ChangeOp):
            key = (op.group, op.topic, op.queue_id)
            queue = self.queues.get(key)
            lease = queue.in_flight.get(op.offset) if queue is not None else None
            if queue is None or lease is None or lease[LEASE_ID] != op.lease:
                return False
            queue.grant(op.offset, (index, op.deadline_ms, lease[ATTEMPT], lease[GROUP]))
            self._record_end(key, op.offset, op.lease, LeaseEnd(CHANGED, index))
            return True
        if isinstance(op, DyingOp):
            self._apply_dying(index, op)
            return False
        if isinstance(op, ResendOp):
            return self._apply_resend(index, op)
        self._set_queue((op.group, op.topic, op.queue_id), PopQueue(op.offset))
        return True

    def _apply_pop(self, index: int, op: PopOp) -> None:
        key = (op.group, op.topic, op.queue_id)
        queue = self.queues.get(key)
        if queue is None:
            # Not op.start: a receive that followed one whose entry was lost
            # starts where that one ended, and must not skip its messages.
            queue = self._set_queue(key, PopQueue(op.start if op.initial is None else op.initial))
        granted: list[tuple[int, int]] = []
        if op.scans and queue.pop_offset == op.start:
            queue.pop_offset = op.end
            groups = op.new_groups
            for i, offset in enumerate(op.new):
                queue.grant(offset, (index, op.deadline_ms, 1, groups[i] if groups is not None else None))
                granted.append((op.queue_id, offset))
            for offset, message_group in op.blocked:
                queue.block(offset, message_group)
        for offset, expired_lease, attempt in op.redo:
            lease = queue.in_flight.get(offset)
            if lease is not None and lease[LEASE_ID] == expired_lease:
                queue.grant(offset, (index, op.deadline_ms, attempt, lease[GROUP]))
                self._record_end(key, offset, expired_lease, LeaseEnd(REDELIVERED, index))
                granted.append((op.queue_id, offset))
        for offset in op.unblock:
            message_group = queue.unblock(offset)
            if message_group is not None:
                queue.grant(offset, (index, op.deadline_ms, 1, message_group))
                granted.append((op.queue_id, offset))
        for offset in op.dropped:
            queue.unblock(offset)
        for offset, expired_lease in op.filtered:
            if queue.release(offset, expired_lease) is not None:
                self._record_end(key, offset, expired_lease, LeaseEnd(FILTERED))
        if op.attempt_id is not None:
            self._remember(op.group, op.attempt_id, index, op.topic, granted)

    def _apply_dying(self, index: int, op: DyingOp) -> None:
        key = (op.group, op.topic, op.queue_id)
        queue = self.queues.get(key)
        if queue is None:
            return
        for offset, lease_id, attempt in op.claims:
            lease = queue.in_flight.get(offset)
            if lease is not None and lease[LEASE_ID] == lease_id:
                queue.grant(offset, (index, op.deadline_ms, attempt, lease[GROUP]))
                self._record_end(key, offset, lease_id, LeaseEnd(DYING, index))

    def _apply_resend(self, index: int, op: ResendOp) -> bool:
        key = (op.group, op.topic, op.queue_id)
        queue = self.queues.get(key)
        if queue is None:
            queue = self._set_queue(key, PopQueue(op.offset + 1 if op.initial is None else op.initial))
        if not queue.resendable(op.offset):
            return False
        # Expired at once, attempt 0: the next receive delivers it as attempt 1.
        queue.grant(op.offset, (index, 0, 0, op.message_group))
        return True

    def _remember(self, group: str, attempt_id: str, index: int, topic: str, granted: list[tuple[int, int]]) -> None:
        key = (group, attempt_id)
        known = self._recent.get(key)
        runs = to_runs(granted)
        if known is not None and known.index == index:
            runs = known.runs + runs  # one receive, several queues in one entry
        self._recent[key] = RecentReceive(index, topic, runs)
        self._recent.move_to_end(key)
        while len(self._recent) > ATTEMPT_CACHE_SIZE:
            self._recent.popitem(last=False)

    def _record_end(self, key: QueueKey, offset: int, lease: int, end: LeaseEnd) -> None:
        self._ended.put((key, offset, lease), (end.how, end.successor))

    def _set_queue(self, key: QueueKey, queue: PopQueue) -> PopQueue:
        self.queues[key] = queue
        self._by_subscription.setdefault((key[0], key[1]), {})[key[2]] = queue
        return queue

    # --------------------------------------------------------------- files
    def capture(self) -> Capture:
        # Nothing is copied on the event loop: each queue begins a capture
        # (O(1)) that journals what changes from now on, and the worker
        # thread that encodes copies the leases in slices and puts the
        # journalled values back (store/captured_dict.py). The copy of a
        # million leases took the loop 35-130 ms with dict.copy.
        queues = sorted(((key, queue.begin_capture()) for key, queue in self.queues.items()),
                        key=lambda item: item[0])
        # Receives by attempt id are state too (derived from the ops, in log
        # order): a node restarted from this file must answer a retry alike.
        # At most ATTEMPT_CACHE_SIZE of them: copied here.
        recent = list(self._recent.items())
        return lambda: {"popQueues": [_encode_queue(key, *capture.read()) for key, capture in queues],
                        "recentReceives": [[group, attempt_id, *r] for (group, attempt_id), r in recent]}

    def encode(self) -> dict[str, Any]:
        return self.capture()()

    def decode(self, data: dict[str, Any]) -> None:
        self.queues, self._by_subscription, self._recent = _build_state(data)

    # ------------------------------------------------- snapshots, off the loop
    @property
    def restoring(self) -> bool:
        return self._restore is not None

    def adopt(self, data: dict[str, Any]) -> None:
        """Build a metadata snapshot's state in a worker thread (a million
        leases took the event loop 1-3 s); entries applied meanwhile wait and
        are applied, in order, once it is in. Decisions taken on the old
        state meanwhile are compare-and-sets that the waiting entries check
        against the new one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.decode(data)  # no loop to keep free (a tool, a test)
            return
        restore = _Restore(data, loop.run_in_executor(None, _build_state, data, True))
        self._restore = restore  # a later snapshot supersedes this one and what waits on it
        restore.future.add_done_callback(lambda _: self._install(restore))

    async def restored(self) -> None:
        """Wait until no snapshot's state is being built."""
        while self._restore is not None:
            await self._restore.done.wait()

    def _install(self, restore: _Restore) -> None:
        if self._restore is not restore:
            restore.done.set()
            return
        try:
            state = restore.future.result()
        except Exception:  # noqa: BLE001 - the state is needed all the same
            log.exception("building the pop state of a metadata snapshot failed in a worker; building it here")
            state = _build_state(restore.data)
        self.queues, self._by_subscription, self._recent = state
        self._restore = None
        applying = self.applying_index
        for index, payload in restore.pending:
            self.applying_index = index
            self._apply_payload(index, payload)
        self.applying_index = applying
        restore.done.set()


_State = tuple[dict[QueueKey, PopQueue], dict[tuple[str, str], dict[int, PopQueue]],
               "OrderedDict[tuple[str, str], RecentReceive]"]


def _build_state(data: dict[str, Any], in_worker: bool = False) -> _State:
    """The pop state a file or snapshot holds, as new objects (reads only
    `data`: may run in a worker thread)."""
    with without_full_collections() if in_worker else contextlib.nullcontext():
        return _build(data, in_worker)


@contextlib.contextmanager
def without_full_collections() -> Iterator[None]:
    """Build a million objects without the cyclic GC walking them again and
    again: each of its full collections holds the GIL, and so the event
    loop, for about 0.2 s at that size. Afterwards they are frozen (moved out
    of the collector's generations): state that lives as long as the node
    is not worth a full collection's walk either. Reference counting still
    frees them when they are replaced."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def _build(data: dict[str, Any], in_worker: bool) -> _State:
    queues: dict[QueueKey, PopQueue] = {}
    by_subscription: dict[tuple[str, str], dict[int, PopQueue]] = {}
    for item in data["popQueues"]:
        key = (item["group"], item["topic"], int(item["queue"]))
        queue = PopQueue(int(item["popOffset"]))
        queue.restore(_decode_in_flight(item["inFlight"]), in_worker)
        queue.blocked = {int(o): str(mg) for o, mg in item["blocked"]}
        queues[key] = queue
        by_subscription.setdefault((key[0], key[1]), {})[key[2]] = queue
    # Files written before attempt ids were kept have none; files written
    # before runs have (queue, offset) pairs.
    recent = OrderedDict(((str(group), str(attempt_id)), RecentReceive(int(index), str(topic), _decode_runs(offsets)))
                         for group, attempt_id, index, topic, offsets in data.get("recentReceives", ()))
    return queues, by_subscription, recent


def _decode_runs(items: list[list[int]]) -> tuple[Run, ...]:
    if all(len(item) == 3 for item in items):
        return tuple((int(q), int(first), int(count)) for q, first, count in items)
    return to_runs((int(q), int(o)) for q, o in items)


def _encode_queue(key: QueueKey, pop_offset: int, offsets: list[int], leases: list[LeaseRow], blocked: dict[int, str]
                  ) -> dict[str, Any]:
    """One queue's entry in popState.json, leases as packed columns in
    offset order (`offsets` sorted, `leases` theirs)."""
    group, topic, queue_id = key
    packed: dict[str, Any] = {
        "count": len(offsets), "offsets": pack_ints(offsets, delta=True),
        "leases": pack_ints(_sliced_map(itemgetter(LEASE_ID), leases), delta=True),
        "deadlines": pack_ints(_sliced_map(itemgetter(DEADLINE), leases), delta=True),
        "attempts": pack_ints(_sliced_map(itemgetter(ATTEMPT), leases))}
    message_groups = _sliced_map(itemgetter(GROUP), leases)
    if message_groups.count(None) != len(message_groups):
        packed["groups"] = pack_json(message_groups)
    return {"group": group, "topic": topic, "queue": queue_id, "popOffset": pop_offset, "inFlight": packed,
            "blocked": [[offset, message_group] for offset, message_group in sorted(blocked.items())]}


_sliced_map = map_in_slices


def _decode_in_flight(value: dict[str, Any] | list[list[Any]]) -> dict[int, LeaseRow]:
    if isinstance(value, list):
        # Files written before the columns were packed: one row per lease.
        return {int(offset): (int(lease), int(deadline), int(attempt), message_group)
                for offset, lease, deadline, attempt, message_group in value}
    count = int(value["count"])
    offsets = unpack_ints(value["offsets"], count, delta=True)
    leases = unpack_ints(value["leases"], count, delta=True)
    deadlines = unpack_ints(value["deadlines"], count, delta=True)
    attempts = unpack_ints(value["attempts"], count)
    message_groups = unpack_json(value["groups"]) if "groups" in value else [None] * count
    if len(message_groups) != count:
        raise ValueError(f"a queue lists {len(message_groups)} message groups for {count} leases")
    return dict(zip(offsets, zip(leases, deadlines, attempts, message_groups)))
