"""TimerState: the timers not yet delivered, derived from the committed log on
every replica (RocketMQ keeps delayOffset.json and the timer wheel's files per
broker; here the state is a function of the log, snapshotted to timers.json).

Inputs, in log order:
- a message stored in a timer topic: a new timer, due at its TIMER_DELIVER_MS
  (or, for a level message without one, its store time + the level's delay);
- a message carrying TIMER_ORIGIN_OFFSET: the copy a leader delivered; the
  timer at that offset is done (when the message ids agree);
- a TIMER_CANCEL system entry: recalled timers, and timers whose topic or
  stored message is gone.

The deliverer asks `due(now)`, a plain method: which timers to deliver next.
"""
from __future__ import annotations

import heapq
import logging
from enum import IntEnum
from typing import Any, Iterable, NamedTuple

from broker.timer.levels import DelayLevels
from store import message_const as mc
from store.codec import DispatchRequest
from store.captured_dict import Captures
from store.config_manager import Capture, ConfigManager
from store.packed_columns import pack_ints, pack_json, unpack_ints, unpack_json

log = logging.getLogger(__name__)

# RocketMQ's topics for level messages (queue = level - 1) and for timed ones.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})


class TimerKind(IntEnum):
    """The timer service's system entries (the broker's kinds 120..129)."""
    CANCEL = 120


class Timer(NamedTuple):
    offset: int       # physical offset of the timer message: its identity on every replica
    due_ms: int
    message_id: str
    topic: str        # where it is delivered
    queue_id: int
    index: int        # the timer message's log entry: retention keeps the log from the oldest


# A pending timer as the state holds it: Timer's fields in a plain tuple of
# ints and strs, which the garbage collector stops tracking the first time it
# sees one. A million pending timers then cost a full collection nothing; as
# objects of a class of their own they were walked by every one (over 100 ms
# with 120,000 timers on a busy 2-core machine: a leader's heartbeats waited
# that long). Handed out as Timer.
Row = tuple[int, int, str, str, int, int]
OFFSET, DUE, MESSAGE_ID, TOPIC, QUEUE_ID, INDEX = range(6)


def cancel_payload(timers: Iterable[Timer], reason: str) -> dict[str, Any]:
    return {"timers": [[t.offset, t.message_id] for t in timers], "reason": reason}


class TimerState(ConfigManager):
    file_name = "timers.json"
    kinds = frozenset({TimerKind.CANCEL})
    # Not in the log's metadata snapshots (millions of timers would not fit
    # one entry): the log is kept from the oldest pending timer message
    # instead, so a replica replaying it from its start derives them all.
    in_metadata_snapshot = False
    indent = None                  # may list a million timers

    def __init__(self, config_dir: str, levels: DelayLevels) -> None:
        super().__init__(config_dir)
        self.levels = levels
        self.pending: dict[int, Row] = {}
        # (due, offset) of pending timers, plus stale pairs of timers already
        # done, dropped lazily: a heap cannot delete from its middle.
        self._heap: list[tuple[int, int]] = []
        self._captures = Captures()   # snapshots being copied (store/captured_dict.py)

    def __len__(self) -> int:
        return len(self.pending)

    def get(self, offset: int) -> Timer | None:
        row = self.pending.get(offset)
        return Timer._make(row) if row is not None else None

    # ---------------------------------------------------------------- inputs
    def on_arrival(self, request: DispatchRequest, index: int) -> bool:
        """Apply a committed message; True when it added a timer (the deliverer
        may need to wake up earlier)."""
        if index <= self.applied_index:
            return False  # a replay after a restart: already in this state
        if request.topic in TIMER_TOPICS:
            row = self._timer_of(request, index)
            if row is not None:
                self._add(row)
            self.applied_index = index
            return row is not None
        origin = request.properties.get(mc.TIMER_ORIGIN_OFFSET)
        if origin is not None:
            self._remove_delivered(origin, request.uniq_key or "")
            self.applied_index = index
        return False

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        if kind == TimerKind.CANCEL:
            for offset, message_id in payload["timers"]:
                row = self.pending.get(int(offset))
                if row is not None and row[MESSAGE_ID] == message_id:
                    self._remove(row[OFFSET])

    def _timer_of(self, request: DispatchRequest, index: int) -> Row | None:
        properties = request.properties
        try:
            if mc.TIMER_DELIVER_MS in properties:
                due = int(properties[mc.TIMER_DELIVER_MS])
            else:
                due = request.store_timestamp + self.levels.delay_ms(int(properties[mc.DELAY_TIME_LEVEL]))
            return (request.physical_offset, due, request.uniq_key or "", properties[mc.REAL_TOPIC],
                    int(properties.get(mc.REAL_QUEUE_ID, "0")), index)
        except (KeyError, ValueError) as error:
            # Only the broker writes timer topics; a message it cannot read as a
            # timer stays in the log, undelivered, and says so once.
            log.error("message at %d in %s is not a timer (%s: %s); it is never delivered",
                      request.physical_offset, request.topic, type(error).__name__, error)
            return None

    def _remove_delivered(self, origin: str, message_id: str) -> None:
        try:
            offset = int(origin)
        except ValueError:
            return
        row = self.pending.get(offset)
        if row is not None and row[MESSAGE_ID] == message_id:
            self._remove(offset)

    def _add(self, row: Row) -> None:
        offset = row[OFFSET]
        if self._captures:
            self._captures.before_change(offset)
        self.pending[offset] = row
        heapq.heappush(self._heap, (row[DUE], offset))

    def _remove(self, offset: int) -> None:
        if self._captures:
            self._captures.before_change(offset)
        del self.pending[offset]
        if len(self._heap) > 2 * len(self.pending) + 1024:
            self._rebuild_heap()  # followers never pop: keep the stale pairs bounded

    def _rebuild_heap(self) -> None:
        self._heap = [(row[DUE], row[OFFSET]) for row in self.pending.values()]
        heapq.heapify(self._heap)

    # ------------------------------------------------------------- decisions
    def due(self, now_ms: int, limit: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[Timer]:
        """Up to `limit` pending timers due at `now_ms`, earliest first, leaving
        out `exclude` (timers the leader is already delivering or recalling)."""
        found: list[tuple[int, int]] = []
        skipped: list[tuple[int, int]] = []
        heap = self._heap
        while heap and len(found) < limit:
            due, offset = heap[0]
            row = self.pending.get(offset)
            if row is None or row[DUE] != due:
                heapq.heappop(heap)  # stale: delivered or cancelled
                continue
            if due > now_ms:
                break
            heapq.heappop(heap)
            (skipped if offset in exclude else found).append((due, offset))
        for pair in found + skipped:
            heapq.heappush(heap, pair)
        return [Timer._make(self.pending[offset]) for _, offset in found]

    def oldest_index(self) -> int | None:
        """The log entry of the oldest pending timer. Timers arrive in log
        order and the dict keeps insertion order, so it is the first one."""
        return next(iter(self.pending.values()))[INDEX] if self.pending else None

    def next_due_ms(self) -> int | None:
        """When the earliest pending timer is due (None: no timers)."""
        heap = self._heap
        while heap:
            due, offset = heap[0]
            row = self.pending.get(offset)
            if row is not None and row[DUE] == due:
                return due
            heapq.heappop(heap)
        return None

    # ------------------------------------------------------------------ file
    def capture(self) -> Capture:
        # Nothing copied on the event loop (a million timers took 40-70 ms
        # with dict()): the capture journals what changes from now on, and
        # the writer's thread copies and sorts them by slices (timers are
        # frozen: replaced, never changed).
        pending = self._captures.begin(self.pending)
        return lambda: {"timers": _pack_timers(pending.sorted_items()[1])}

    def encode(self) -> dict[str, Any]:
        return self.capture()()

    def decode(self, data: dict[str, Any]) -> None:
        self._captures.clear()
        self.pending = {}
        # In offset order, which is log order: oldest_index relies on it.
        for row in sorted(_unpack_timers(data["timers"]), key=lambda row: row[OFFSET]):
            self.pending[row[OFFSET]] = row
        self._rebuild_heap()


def _pack_timers(rows: list[Row]) -> dict[str, Any]:
    """Timers in offset order as packed columns (store/packed_columns.py);
    the topics they go to, few, are named once."""
    topics = sorted({row[TOPIC] for row in rows})
    topic_number = {topic: n for n, topic in enumerate(topics)}
    return {"count": len(rows), "topics": topics,
            "offsets": pack_ints([row[OFFSET] for row in rows], delta=True),
            "due": pack_ints([row[DUE] for row in rows], delta=True),
            "messageIds": pack_json([row[MESSAGE_ID] for row in rows]),
            "topicOf": pack_ints([topic_number[row[TOPIC]] for row in rows]),
            "queueIds": pack_ints([row[QUEUE_ID] for row in rows]),
            "indexes": pack_ints([row[INDEX] for row in rows], delta=True)}


def _unpack_timers(data: dict[str, Any] | list[list[Any]]) -> list[Row]:
    if isinstance(data, list):
        # Files written before the columns were packed: one row per timer.
        return [(int(offset), int(due), str(message_id), str(topic), int(queue_id), int(index))
                for offset, due, message_id, topic, queue_id, index in data]
    count = int(data["count"])
    topics = [str(topic) for topic in data["topics"]]
    message_ids = unpack_json(data["messageIds"])
    if len(message_ids) != count:
        raise ValueError(f"timers.json lists {len(message_ids)} message ids for {count} timers")
    columns = zip(unpack_ints(data["offsets"], count, delta=True), unpack_ints(data["due"], count, delta=True),
                  message_ids, unpack_ints(data["topicOf"], count), unpack_ints(data["queueIds"], count),
                  unpack_ints(data["indexes"], count, delta=True))
    return [(offset, due, str(message_id), topics[topic], queue_id, index)
            for offset, due, message_id, topic, queue_id, index in columns]
