"""What happened in a chaos run: every operation (invoked, then ok, failed or
unknown) and every fault window, with times in seconds on the monotonic clock
since the run's start.

Outcomes, as in Jepsen:
- ok: the cluster acknowledged the append and named its index;
- fail: the cluster answered that the append was not applied (NOT_LEADER and
  the like): its entries must never appear in the log;
- unknown: no answer, or an answer that leaves it open (a timeout, a broken
  connection, TERM_CHANGED): its entries may appear, at most once.

The history file is JSON lines in time order: one `invoke` line and one
completion line (`ok`, `fail` or `unknown`) per operation, a `fault-start` and
a `fault-end` line per fault window. The broker workload adds what only it
has: a `sent` line per logical message (its kind, due time, transaction
intent), a `delivery` line per message a receive returned, and a `check` line
per transaction check-back the producer answered. Its operations carry a
`kind` (send, receive, ack, end) and a consumer `group`. `load_history` reads it back, so a run's
verdict can be recomputed from its files.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterator


# The client name of the operations the nemesis sends straight to an isolated
# leader (`probe-<node>`): they test that node, not the cluster's availability.
PROBE_PREFIX = "probe-"


class Outcome(str, Enum):
    PENDING = "pending"   # invoked, no completion yet
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass
class Operation:
    """One append of one or more bodies, each carrying a unique id."""
    number: int
    client: str
    ids: tuple[str, ...]
    invoke_s: float
    complete_s: float | None = None
    outcome: Outcome = Outcome.PENDING
    first_index: int | None = None   # when ok: the index of ids[0]; the rest follow
    error: str = ""
    kind: str = "append"   # the log workload's; the broker's: send, receive, ack, end
    group: str = ""        # the consumer group of a receive or an ack

    @property
    def last_index(self) -> int | None:
        return None if self.first_index is None else self.first_index + len(self.ids) - 1

    @property
    def latency_s(self) -> float | None:
        return None if self.complete_s is None else self.complete_s - self.invoke_s


@dataclass
class FaultWindow:
    """One fault, from its injection to its heal."""
    number: int
    kind: str
    targets: tuple[str, ...]
    start_s: float
    end_s: float | None = None
    detail: str = ""
    group: int = 0          # the planned fault it carries out (two windows share one in a combo)
    in_combo: bool = False


@dataclass
class SentMessage:
    """One logical message of the broker workload (sent once, retried by the
    client with the same message id)."""
    uid: str
    topic: str
    kind: str                      # normal, fifo, delay, txn
    client: str                    # who sent it ("official-..." for the official client)
    message_group: str = ""
    due_ms: int = 0                # a delayed message: when it is due, wall clock ms
    intent: str = ""               # a transaction: commit, rollback, undecided (left to check-back)
    never_ack: bool = False        # consumers never ack it: redelivered, then dead-lettered


@dataclass
class Delivery:
    """A message one receive returned to one consumer of a group."""
    time_s: float                  # when the receive's answer arrived
    receive_invoke_s: float        # when that receive was invoked
    wall_ms: int                   # the same moment on the wall clock (due times are wall clock)
    group: str
    consumer: str
    uid: str
    message_id: str
    attempt: int


@dataclass
class CheckBack:
    """A transaction check-back the producer answered."""
    time_s: float
    uid: str
    answer: str                    # commit, rollback


@dataclass
class History:
    started_at: float = field(default_factory=time.monotonic)
    operations: list[Operation] = field(default_factory=list)
    faults: list[FaultWindow] = field(default_factory=list)
    wall_started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    sent: dict[str, SentMessage] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    checks: list[CheckBack] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started_at

    def wall_to_s(self, wall_ms: int) -> float:
        """A wall-clock time (ms) on this history's clock."""
        return (wall_ms - self.wall_started_ms) / 1000.0

    # --------------------------------------------------------- operations
    def invoke(self, client: str, ids: tuple[str, ...], kind: str = "append", group: str = "") -> Operation:
        op = Operation(len(self.operations) + 1, client, ids, self.now(), kind=kind, group=group)
        self.operations.append(op)
        return op

    def delivered(self, group: str, consumer: str, uid: str, message_id: str, attempt: int,
                  receive_invoke_s: float) -> Delivery:
        delivery = Delivery(self.now(), receive_invoke_s, int(time.time() * 1000), group, consumer, uid,
                            message_id, attempt)
        self.deliveries.append(delivery)
        return delivery

    def ok(self, op: Operation, first_index: int) -> None:
        op.first_index = first_index
        self._complete(op, Outcome.OK, "")

    def fail(self, op: Operation, error: str) -> None:
        self._complete(op, Outcome.FAIL, error)

    def unknown(self, op: Operation, error: str) -> None:
        self._complete(op, Outcome.UNKNOWN, error)

    def _complete(self, op: Operation, outcome: Outcome, error: str) -> None:
        op.complete_s, op.outcome, op.error = self.now(), outcome, error

    # ------------------------------------------------------------- faults
    def fault_started(self, kind: str, targets: tuple[str, ...], detail: str = "") -> FaultWindow:
        window = FaultWindow(len(self.faults) + 1, kind, targets, self.now(), detail=detail)
        self.faults.append(window)
        return window

    def fault_ended(self, window: FaultWindow) -> None:
        window.end_s = self.now()

    # -------------------------------------------------------------- files
    def events(self) -> list[dict[str, Any]]:
        """Every event as a JSON-able dict, in time order."""
        rows: list[tuple[float, int, dict[str, Any]]] = []
        rows.append((-1.0, 0, {"type": "start", "wall_ms": self.wall_started_ms, "time_s": 0.0}))
        for message in self.sent.values():
            rows.append((-1.0, 1, {"type": "sent", **asdict(message), "time_s": 0.0}))
        for op in self.operations:
            invoke: dict[str, Any] = {"type": "invoke", "op": op.number, "client": op.client, "ids": list(op.ids),
                                      "time_s": round(op.invoke_s, 6)}
            if op.kind != "append":
                invoke["kind"] = op.kind
            if op.group:
                invoke["group"] = op.group
            rows.append((op.invoke_s, 0, invoke))
            if op.complete_s is not None:
                line: dict[str, Any] = {"type": op.outcome.value, "op": op.number,
                                        "time_s": round(op.complete_s, 6)}
                if op.first_index is not None:
                    line["index"] = op.first_index
                if op.error:
                    line["error"] = op.error
                rows.append((op.complete_s, 1, line))
        for window in self.faults:
            rows.append((window.start_s, 0, {"type": "fault-start", "fault": window.number, "kind": window.kind,
                                             "targets": list(window.targets), "detail": window.detail,
                                             "group": window.group, "combo": window.in_combo,
                                             "time_s": round(window.start_s, 6)}))
            if window.end_s is not None:
                rows.append((window.end_s, 1, {"type": "fault-end", "fault": window.number,
                                               "time_s": round(window.end_s, 6)}))
        for d in self.deliveries:
            rows.append((d.time_s, 1, {"type": "delivery", **asdict(d), "time_s": round(d.time_s, 6),
                                       "receive_invoke_s": round(d.receive_invoke_s, 6)}))
        for c in self.checks:
            rows.append((c.time_s, 1, {"type": "check", "uid": c.uid, "answer": c.answer,
                                       "time_s": round(c.time_s, 6)}))
        rows.sort(key=lambda row: (row[0], row[1]))
        return [row[2] for row in rows]

    def write(self, path: Path) -> None:
        with open(path, "w") as out:
            for event in self.events():
                out.write(json.dumps(event, separators=(",", ":")) + "\n")


def load_history(path: Path) -> History:
    history = History(started_at=0.0)
    ops: dict[int, Operation] = {}
    windows: dict[int, FaultWindow] = {}
    for event in _read_lines(path):
        kind = event["type"]
        if kind == "start":
            history.wall_started_ms = event["wall_ms"]
        elif kind == "sent":
            fields = {k: v for k, v in event.items() if k not in ("type", "time_s")}
            history.sent[event["uid"]] = SentMessage(**fields)
        elif kind == "delivery":
            fields = {k: v for k, v in event.items() if k != "type"}
            history.deliveries.append(Delivery(**fields))
        elif kind == "check":
            history.checks.append(CheckBack(event["time_s"], event["uid"], event["answer"]))
        elif kind == "invoke":
            op = Operation(event["op"], event["client"], tuple(event["ids"]), event["time_s"],
                           kind=event.get("kind", "append"), group=event.get("group", ""))
            ops[op.number] = op
            history.operations.append(op)
        elif kind in ("ok", "fail", "unknown"):
            op = ops[event["op"]]
            op.outcome, op.complete_s = Outcome(kind), event["time_s"]
            op.first_index, op.error = event.get("index"), event.get("error", "")
        elif kind == "fault-start":
            window = FaultWindow(event["fault"], event["kind"], tuple(event["targets"]), event["time_s"],
                                 detail=event.get("detail", ""), group=event.get("group", 0),
                                 in_combo=event.get("combo", False))
            windows[window.number] = window
            history.faults.append(window)
        elif kind == "fault-end":
            windows[event["fault"]].end_s = event["time_s"]
    return history


def _read_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path) as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)
