"""TransactionState: undecided half messages and recent outcomes, derived
from the committed log on every replica and snapshotted to transactions.json
(RocketMQ keeps this in RMQ_SYS_TRANS_HALF_TOPIC and RMQ_SYS_TRANS_OP_HALF_TOPIC).

Inputs, in log order:
- a prepared message in the half topic: a new undecided transaction, first
  checked CHECK_IMMUNITY_TIME_IN_SECONDS after it was stored;
- a commit-type message whose PREPAREDTRANSACTIONOFFSET names a pending half
  message (with the same message id): committed;
- TRANSACTION_ROLLBACK: rolled back (by the producer, a check's answer, or
  after the maximum number of checks);
- TRANSACTION_CHECK: those half messages were checked once more; the entry
  carries when and the interval, so every replica computes the same next check.

Outcomes are remembered (a bounded number) so that a repeated EndTransaction,
a producer's retry after a lost answer or a failover, is answered as the
first one was.
"""
from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from operator import itemgetter
from typing import Any, Iterable, NamedTuple

from store import message_const as mc
from store.codec import DispatchRequest
from store.captured_dict import Captures
from store.config_manager import Capture, ConfigManager

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
# Outcomes remembered for repeated EndTransactions (a retry comes within
# seconds; this covers a busy broker's last few minutes).
REMEMBERED_OUTCOMES = 20_000


class TransactionKind(IntEnum):
    """The transaction service's system entries (the broker's kinds 130..139)."""
    ROLLBACK = 130
    CHECK = 131


class HalfMessage(NamedTuple):
    """An undecided half message as `get` and `due_for_check` hand it out.
    The state holds each as a plain tuple of these fields in this order (a
    row, also the file's), not as an object: the garbage collector leaves
    plain tuples of ints and strs alone once it has looked at them, while it
    walks every object at each full collection, on the event loop (300,000
    undecided as objects: 65-71 ms a collection on an idle machine, as
    rows 1-3 ms)."""
    offset: int           # physical offset of the half message: its identity on every replica
    message_id: str
    topic: str            # the real topic and queue
    queue_id: int
    stored_ms: int
    next_check_ms: int
    index: int            # the half message's log entry: retention keeps the log from the oldest
    check_times: int = 0


HalfRow = tuple[int, str, str, int, int, int, int, int]   # HalfMessage's fields, as the state holds them
_OFFSET, _MESSAGE_ID, _NEXT_CHECK, _INDEX, _CHECK_TIMES = 0, 1, 5, 6, 7


@dataclass(frozen=True, slots=True)
class Outcome:
    message_id: str
    resolution: str       # COMMIT or ROLLBACK
    reason: str


def rollback_payload(halves: Iterable[HalfMessage], reason: str) -> dict[str, Any]:
    return {"halves": [[h.offset, h.message_id] for h in halves], "reason": reason}


def check_payload(halves: Iterable[HalfMessage], checked_ms: int, interval_ms: int) -> dict[str, Any]:
    return {"halves": [[h.offset, h.message_id] for h in halves], "checkedAt": checked_ms,
            "intervalMs": interval_ms}


class TransactionState(ConfigManager):
    file_name = "transactions.json"
    kinds = frozenset({TransactionKind.ROLLBACK, TransactionKind.CHECK})
    # Not in the log's metadata snapshots: the log is kept from the oldest
    # undecided half message instead (see TimerState), so replaying it derives
    # them, their check counts and outcomes since.
    in_metadata_snapshot = False
    indent = None                  # up to 20,000 outcomes: written compact, in C

    def __init__(self, config_dir: str, default_immunity_ms: int) -> None:
        super().__init__(config_dir)
        self.default_immunity_ms = default_immunity_ms
        self.halves: dict[int, HalfRow] = {}   # offset -> row, in log order
        self.outcomes: OrderedDict[int, Outcome] = OrderedDict()
        self._captures = Captures()   # snapshots being copied (store/captured_dict.py)

    def get(self, offset: int) -> HalfMessage | None:
        row = self.halves.get(offset)
        return HalfMessage._make(row) if row is not None else None

    def outcome(self, offset: int) -> Outcome | None:
        return self.outcomes.get(offset)

    # ---------------------------------------------------------------- inputs
    def on_arrival(self, request: DispatchRequest, index: int) -> None:
        if index <= self.applied_index:
            return  # a replay after a restart: already in this state
        kind = mc.transaction_type(request.sys_flag)
        if request.topic == HALF_TOPIC and kind == mc.TRANSACTION_PREPARED_TYPE:
            self._add(request, index)
            self.applied_index = index
        elif kind == mc.TRANSACTION_COMMIT_TYPE:
            self._resolve([(request.prepared_transaction_offset, request.uniq_key or "")], COMMIT, "commit")
            self.applied_index = index

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        pairs = [(int(offset), str(message_id)) for offset, message_id in payload["halves"]]
        if kind == TransactionKind.ROLLBACK:
            self._resolve(pairs, ROLLBACK, str(payload.get("reason", "")))
        elif kind == TransactionKind.CHECK:
            next_check = int(payload["checkedAt"]) + int(payload["intervalMs"])
            for offset, message_id in pairs:
                half = self.halves.get(offset)
                if half is not None and half[_MESSAGE_ID] == message_id:
                    # Replaced, not changed in place: a snapshot's capture holds the rows.
                    self._before_change(offset)
                    self.halves[offset] = half[:_NEXT_CHECK] + (next_check, half[_INDEX], half[_CHECK_TIMES] + 1)

    def _add(self, request: DispatchRequest, index: int) -> None:
        properties = request.properties
        try:
            topic = properties[mc.REAL_TOPIC]
            queue_id = int(properties.get(mc.REAL_QUEUE_ID, "0"))
        except (KeyError, ValueError) as error:
            log.error("half message at %d names no real topic and queue (%s); it is never committed",
                      request.physical_offset, error)
            return
        immunity_ms = self._immunity_ms(properties.get(mc.CHECK_IMMUNITY_TIME_IN_SECONDS))
        self._before_change(request.physical_offset)
        self.halves[request.physical_offset] = (
            request.physical_offset, request.uniq_key or "", topic, queue_id, request.store_timestamp,
            request.store_timestamp + immunity_ms, index, 0)

    def _immunity_ms(self, text: str | None) -> int:
        """RocketMQ's getImmunityTime: the property in seconds, or the default."""
        try:
            return max(0, int(text)) * 1000 if text is not None else self.default_immunity_ms
        except ValueError:
            return self.default_immunity_ms

    def _resolve(self, pairs: Iterable[tuple[int, str]], resolution: str, reason: str) -> None:
        for offset, message_id in pairs:
            half = self.halves.get(offset)
            if half is None or half[_MESSAGE_ID] != message_id:
                continue
            self._before_change(offset)
            del self.halves[offset]
            self.outcomes[offset] = Outcome(message_id, resolution, reason)
            if len(self.outcomes) > REMEMBERED_OUTCOMES:
                self.outcomes.popitem(last=False)

    def oldest_index(self) -> int | None:
        """The log entry of the oldest undecided half message (halves arrive in
        log order; the dict keeps insertion order)."""
        return next(iter(self.halves.values()))[_INDEX] if self.halves else None

    # ------------------------------------------------------------- decisions
    def due_for_check(self, now_ms: int, limit: int, exclude: set[int] | frozenset[int] = frozenset()
                      ) -> list[HalfMessage]:
        """Up to `limit` undecided half messages whose next check has come,
        longest waiting first, leaving out `exclude` (being ended now)."""
        due = [h for h in self.halves.values() if h[_NEXT_CHECK] <= now_ms and h[_OFFSET] not in exclude]
        # The first `limit` only: sorting every due half cost 100 ms a check
        # with 100,000 of them undecided.
        return [HalfMessage._make(h) for h in heapq.nsmallest(limit, due, key=itemgetter(_NEXT_CHECK, _OFFSET))]

    # ------------------------------------------------------------------ file
    def capture(self) -> Capture:
        # No copy of the halves on the event loop (a capture that journals
        # later changes, store/captured_dict.py: halves are replaced, never
        # changed in place); the outcomes, at most REMEMBERED_OUTCOMES, are
        # copied. The rows are built in the writer's thread.
        halves, outcomes = self._captures.begin(self.halves), list(self.outcomes.items())
        return lambda: _encode(halves.sorted_items()[1], outcomes)

    def _before_change(self, offset: int) -> None:
        if self._captures:
            self._captures.before_change(offset)

    def encode(self) -> dict[str, Any]:
        return self.capture()()

    def decode(self, data: dict[str, Any]) -> None:
        self._captures.clear()
        self.halves = {}
        # Sorted by offset in the file, which is log order: oldest_index relies on it.
        for offset, message_id, topic, queue_id, stored_ms, next_check_ms, index, check_times in \
                sorted(data["halves"]):
            self.halves[int(offset)] = (int(offset), str(message_id), str(topic), int(queue_id),
                                        int(stored_ms), int(next_check_ms), int(index), int(check_times))
        self.outcomes = OrderedDict((int(offset), Outcome(str(message_id), str(resolution), str(reason)))
                                    for offset, message_id, resolution, reason in data.get("outcomes", []))


def _encode(halves: list[HalfRow], outcomes: list[tuple[int, Outcome]]) -> dict[str, Any]:
    """`halves` in offset order (rows in the file's field order)."""
    # Rows built field by field: dataclasses.astuple deep-copies, and was most
    # of the cost of a snapshot holding 20,000 outcomes.
    return {"halves": [list(h) for h in halves],
            "outcomes": [[offset, o.message_id, o.resolution, o.reason] for offset, o in outcomes]}
