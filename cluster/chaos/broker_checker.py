"""The broker checker: what a RocketMQ user relies on, proved from a broker
workload's History and every node's committed log (and derived state) after
healing.

- lost: an acknowledged send (a committed transaction's message included)
  that no consumer group subscribed to its topic ever received, and that is
  in none of their dead-letter queues;
- missed: the same per group: (message, group) pairs the group never
  received nor dead-lettered (every group subscribed to a topic is owed every
  message of it);
- redelivered_after_ack: a message delivered to a group by a receive invoked
  after the group's ack of it was acknowledged OK;
- acked_in_dlq: a message in a group's dead-letter queue although the group's
  ack of it was acknowledged OK;
- duplicate_sends: one logical message (its unique id) stored twice in its
  topic (a producer's retries are recognised by message id within the last
  200,000 log entries, `dedupe_window_entries`);
- fifo_violations: a message of a FIFO group's message group delivered while
  an earlier message of that message group (queue order) was neither acked
  (an ack invoked before the delivery) nor in the dead-letter queue;
- early_delayed: a delayed message delivered, or stored in its topic, more
  than 10 ms before it was due; `late_delayed` gives how late first
  deliveries were (statistics, not a failure);
- rolled_back_delivered: a transaction rolled back (by its producer or by a
  check-back answer) whose message was stored in its topic or delivered;
- committed_lost: a transaction committed (end acknowledged, or check-back
  answered COMMIT) whose message is not in its topic;
- check_back_wrong: a check-back for a transaction whose end the broker had
  acknowledged more than a second before;
- dlq_early: a message in a group's dead-letter queue before the group saw
  its last attempt (max attempts), unless a receive of that group lost its
  answer after the last delivery seen (the missing attempt may be in it);
- diverged: the committed logs differ (as the log checker sees it);
- state_diverged: the nodes' ConsumeQueues, consumer offsets or pop state
  differ after healing.

Clocks: operation and delivery times are the history's monotonic seconds;
due times and store timestamps are wall clock ms, compared with the wall
clock time each delivery was recorded at.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from cluster.chaos.checker import Divergence, LogEntry, find_divergence
from cluster.chaos.history import History, Operation, Outcome
from dledger.entry import MAGIC_NORMAL
from store import codec
from store import message_const as mc
from store.errors import MessageDecodeError

EXAMPLES = 5
BODY_PREFIX = b"bchaos:"
DLQ_PREFIX = "%DLQ%"
# A delayed message may be delivered this much before its due time (clocks
# and rounding), no more.
EARLY_TOLERANCE_MS = 10
# A check-back sent just before the end was applied may reach the producer
# just after the end was acknowledged.
CHECK_GRACE_S = 1.0


def uid_of(body: bytes) -> str | None:
    """The workload's unique id in a message body, or None."""
    if not body.startswith(BODY_PREFIX):
        return None
    return body[len(BODY_PREFIX):].split(b" ", 1)[0].decode("ascii", "replace")


@dataclass(frozen=True)
class GroupSpec:
    name: str
    topics: tuple[str, ...]
    fifo: bool = False
    max_attempts: int = 17


@dataclass(frozen=True)
class StoredMessage:
    """A workload message as the committed log holds it."""
    index: int
    topic: str
    uid: str
    queue_id: int
    queue_offset: int
    store_ms: int
    dlq_origin_topic: str = ""


def stored_messages(entries: list[LogEntry]) -> list[StoredMessage]:
    found = []
    for entry in entries:
        if entry.magic != MAGIC_NORMAL:
            continue
        try:
            message = codec.decode(entry.body)
        except MessageDecodeError:
            continue   # a system entry
        uid = uid_of(message.body)
        if uid is not None:
            found.append(StoredMessage(entry.index, message.topic, uid, message.queue_id, message.queue_offset,
                                       message.store_timestamp, message.properties.get(mc.DLQ_ORIGIN_TOPIC, "")))
    return found


@dataclass
class BrokerCheckResult:
    lost: list[str] = field(default_factory=list)
    missed: list[tuple[str, str]] = field(default_factory=list)
    redelivered_after_ack: list[tuple[str, str]] = field(default_factory=list)
    acked_in_dlq: list[tuple[str, str]] = field(default_factory=list)
    duplicate_sends: list[str] = field(default_factory=list)
    fifo_violations: list[tuple[str, str]] = field(default_factory=list)
    early_delayed: list[str] = field(default_factory=list)
    rolled_back_delivered: list[str] = field(default_factory=list)
    committed_lost: list[str] = field(default_factory=list)
    check_back_wrong: list[str] = field(default_factory=list)
    dlq_early: list[tuple[str, str]] = field(default_factory=list)
    diverged: list[Divergence] = field(default_factory=list)
    state_diverged: list[str] = field(default_factory=list)
    # Information, not failures.
    late_delayed: dict[str, float | int | None] = field(default_factory=dict)
    dead_lettered: int = 0
    deliveries: int = 0
    redeliveries: int = 0
    unknown_sends_landed: int = 0

    FAILURES = ("lost", "missed", "redelivered_after_ack", "acked_in_dlq", "duplicate_sends", "fifo_violations",
                "early_delayed", "rolled_back_delivered", "committed_lost", "check_back_wrong", "dlq_early",
                "diverged", "state_diverged")

    @property
    def valid(self) -> bool:
        return not any(getattr(self, name) for name in self.FAILURES)

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.FAILURES}

    def examples(self) -> dict[str, list[object]]:
        shown = {name: [vars(x) if isinstance(x, Divergence) else x for x in getattr(self, name)[:EXAMPLES]]
                 for name in self.FAILURES}
        return {k: v for k, v in shown.items() if v}


def check_broker(history: History, logs: dict[str, list[LogEntry]], groups: list[GroupSpec],
                 node_states: dict[str, dict[str, str]] | None = None) -> BrokerCheckResult:
    if not logs:
        raise ValueError("no committed log to check")
    result = BrokerCheckResult()
    result.diverged = find_divergence(logs)
    result.state_diverged = find_state_divergence(node_states or {})
    reference = logs[max(logs, key=lambda n: (len(logs[n]), n))]
    facts = Facts(history, stored_messages(reference), groups)
    result.deliveries = len(history.deliveries)
    result.redeliveries = sum(1 for d in history.deliveries if d.attempt > 1)
    result.dead_lettered = sum(len(v) for v in facts.dlq.values())
    check_sends(facts, result)
    check_delivery(facts, result)
    check_acks(facts, result)
    check_fifo(facts, result)
    check_delayed(facts, result)
    check_transactions(facts, result)
    check_dead_letters(facts, result)
    return result


class Facts:
    """The history and the log, indexed the ways the checks need."""

    def __init__(self, history: History, stored: list[StoredMessage], groups: list[GroupSpec]) -> None:
        self.history = history
        self.groups = {g.name: g for g in groups}
        self.sent = history.sent
        self.sends: dict[str, Operation] = {}
        self.acks: dict[tuple[str, str], list[Operation]] = defaultdict(list)
        self.ends: dict[str, list[Operation]] = defaultdict(list)
        self.receives: dict[str, list[Operation]] = defaultdict(list)
        for op in history.operations:
            if op.kind == "send":
                for uid in op.ids:
                    self.sends[uid] = op
            elif op.kind == "ack":
                for uid in op.ids:
                    self.acks[(op.group, uid)].append(op)
            elif op.kind == "end":
                for uid in op.ids:
                    self.ends[uid].append(op)
            elif op.kind == "receive":
                self.receives[op.group].append(op)
        # (topic, uid) -> copies in the topic itself; group -> uid -> DLQ copies.
        self.in_topic: dict[tuple[str, str], list[StoredMessage]] = defaultdict(list)
        self.dlq: dict[str, dict[str, StoredMessage]] = defaultdict(dict)
        for message in stored:
            if message.topic.startswith(DLQ_PREFIX):
                self.dlq[message.topic[len(DLQ_PREFIX):]].setdefault(message.uid, message)
            else:
                self.in_topic[(message.topic, message.uid)].append(message)
        self.delivered: dict[tuple[str, str], list] = defaultdict(list)
        for d in history.deliveries:
            self.delivered[(d.group, d.uid)].append(d)

    def acknowledged(self, uid: str) -> bool:
        op = self.sends.get(uid)
        return op is not None and op.outcome is Outcome.OK

    def committed(self, uid: str) -> bool | None:
        """A transaction's decision as the producer knows it: True (commit
        acknowledged or answered to a check), False (rollback), None."""
        for op in self.ends.get(uid, ()):
            if op.outcome is Outcome.OK:
                return self.sent[uid].intent == "commit"
        answers = [c.answer for c in self.history.checks if c.uid == uid]
        if answers:
            return answers[-1] == "commit"
        return None

    def owed(self, uid: str) -> bool:
        """Whether consumers must receive this message."""
        sent = self.sent.get(uid)
        if sent is None or not self.acknowledged(uid):
            return False
        if sent.kind == "txn":
            return self.committed(uid) is True and (sent.topic, uid) in self.in_topic
        return True

    def subscribers(self, topic: str) -> list[GroupSpec]:
        return [g for g in self.groups.values() if topic in g.topics]


def check_sends(facts: Facts, result: BrokerCheckResult) -> None:
    for (topic, uid), copies in facts.in_topic.items():
        if len(copies) > 1:
            result.duplicate_sends.append(uid)
        op = facts.sends.get(uid)
        if op is not None and op.outcome is not Outcome.OK:
            result.unknown_sends_landed += 1


def check_delivery(facts: Facts, result: BrokerCheckResult) -> None:
    for uid, sent in facts.sent.items():
        if not facts.owed(uid):
            continue
        groups = facts.subscribers(sent.topic)
        received = [g.name for g in groups
                    if facts.delivered.get((g.name, uid)) or uid in facts.dlq.get(g.name, {})]
        if groups and not received:
            result.lost.append(uid)
        result.missed.extend((uid, g.name) for g in groups if g.name not in received)


def _acked_at(facts: Facts, group: str, uid: str) -> float | None:
    """When the group's first acknowledged (OK) ack of the message completed."""
    times = [op.complete_s for op in facts.acks.get((group, uid), ())
             if op.outcome is Outcome.OK and op.complete_s is not None]
    return min(times) if times else None


def check_acks(facts: Facts, result: BrokerCheckResult) -> None:
    for (group, uid), deliveries in facts.delivered.items():
        acked = _acked_at(facts, group, uid)
        if acked is None:
            continue
        if any(d.receive_invoke_s > acked for d in deliveries):
            result.redelivered_after_ack.append((group, uid))
    for group, copies in facts.dlq.items():
        for uid in copies:
            if _acked_at(facts, group, uid) is not None:
                result.acked_in_dlq.append((group, uid))


def check_fifo(facts: Facts, result: BrokerCheckResult) -> None:
    """Per FIFO group and message group, in queue order: each message is let
    go when the group acks it (the ack's invoke) or it is dead-lettered; a
    delivery of a message before every earlier one was let go violates,
    unless the earlier one came in the same batch (one receive's answer
    holds a message group's messages in order)."""
    by_message_group: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for uid, sent in facts.sent.items():
        if sent.kind != "fifo" or not sent.message_group:
            continue
        copies = facts.in_topic.get((sent.topic, uid))
        if copies:
            by_message_group[(sent.topic, sent.message_group)].append((copies[0].queue_offset, uid))
    for group in facts.groups.values():
        if not group.fifo:
            continue
        for (topic, _), members in by_message_group.items():
            if topic not in group.topics:
                continue
            earlier: list[tuple[float, set[tuple[str, float]]]] = []   # (released at, batches it came in)
            for _, uid in sorted(members):
                deliveries = facts.delivered.get((group.name, uid), ())
                for d in deliveries:
                    batch = (d.consumer, d.receive_invoke_s)
                    if any(released > d.time_s and batch not in batches for released, batches in earlier):
                        result.fifo_violations.append((group.name, uid))
                        break
                earlier.append((_released_at(facts, group.name, uid),
                                {(d.consumer, d.receive_invoke_s) for d in deliveries}))


def _released_at(facts: Facts, group: str, uid: str) -> float:
    acks = [op.invoke_s for op in facts.acks.get((group, uid), ()) if op.outcome is not Outcome.FAIL]
    dlq = facts.dlq.get(group, {}).get(uid)
    times = acks + ([facts.history.wall_to_s(dlq.store_ms)] if dlq is not None else [])
    return min(times) if times else float("inf")


def check_delayed(facts: Facts, result: BrokerCheckResult) -> None:
    lateness: list[int] = []
    for uid, sent in facts.sent.items():
        if sent.kind != "delay" or not sent.due_ms:
            continue
        early = [c for c in facts.in_topic.get((sent.topic, uid), ())
                 if c.store_ms < sent.due_ms - EARLY_TOLERANCE_MS]
        firsts = []
        for group in facts.subscribers(sent.topic):
            deliveries = facts.delivered.get((group.name, uid), [])
            if any(d.wall_ms < sent.due_ms - EARLY_TOLERANCE_MS for d in deliveries):
                early.append(None)   # type: ignore[arg-type]
            if deliveries:
                firsts.append(min(d.wall_ms for d in deliveries))
        if early:
            result.early_delayed.append(uid)
        lateness.extend(f - sent.due_ms for f in firsts)
    if lateness:
        lateness.sort()
        result.late_delayed = {"count": len(lateness), "median_ms": statistics.median(lateness),
                               "p99_ms": lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))],
                               "max_ms": lateness[-1]}
    else:
        result.late_delayed = {"count": 0, "median_ms": None, "p99_ms": None, "max_ms": None}


def check_transactions(facts: Facts, result: BrokerCheckResult) -> None:
    for uid, sent in facts.sent.items():
        if sent.kind != "txn" or not facts.acknowledged(uid):
            continue
        decision = facts.committed(uid)
        stored = (sent.topic, uid) in facts.in_topic
        delivered = any(facts.delivered.get((g.name, uid)) for g in facts.subscribers(sent.topic))
        if decision is False and (stored or delivered):
            result.rolled_back_delivered.append(uid)
        elif decision is True and not stored:
            result.committed_lost.append(uid)
    for check in facts.history.checks:
        ended = [op.complete_s for op in facts.ends.get(check.uid, ())
                 if op.outcome is Outcome.OK and op.complete_s is not None]
        if ended and check.time_s > min(ended) + CHECK_GRACE_S:
            result.check_back_wrong.append(check.uid)


def check_dead_letters(facts: Facts, result: BrokerCheckResult) -> None:
    for group_name, copies in facts.dlq.items():
        group = facts.groups.get(group_name)
        if group is None:
            continue
        for uid in copies:
            deliveries = facts.delivered.get((group_name, uid), [])
            highest = max((d.attempt for d in deliveries), default=0)
            if highest >= group.max_attempts:
                continue
            last_seen = max((d.time_s for d in deliveries), default=0.0)
            answer_lost = any(op.outcome is not Outcome.OK and (op.complete_s or float("inf")) >= last_seen
                              for op in facts.receives.get(group_name, ()))
            if not answer_lost:
                result.dlq_early.append((group_name, uid))


def find_state_divergence(node_states: dict[str, dict[str, str]]) -> list[str]:
    """The state items (ConsumeQueue files, offsets, pop state) whose digest
    differs between nodes, or that some node lacks."""
    if len(node_states) < 2:
        return []
    names = sorted(set().union(*(s.keys() for s in node_states.values())))
    return [name for name in names if len({s.get(name) for s in node_states.values()}) > 1]
