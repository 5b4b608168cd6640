"""The checker: given a History and every node's committed log (read after
healing and convergence), what went wrong.

- lost: an id of an acknowledged append is in no committed entry;
- misplaced: it is there, but not at the index the client was told;
- duplicated: an id is in more than one committed entry;
- unexpected: a committed entry that no client sent (no workload id, or an id
  never invoked);
- failed_present: an append the cluster said it did not apply is in the log;
- diverged: an index two nodes both hold committed with different term, magic,
  body or chain CRC (the chain CRC covers every entry before it, so equal chain
  CRCs at the last index mean equal logs), or a node whose log has a hole;
- order_violations: A was acknowledged before B was invoked, yet B's index is
  not above A's (unknown operations whose entries are in the log count as B
  too, at the index where they landed);
- stale_leader_acks: an append to an isolated old leader, invoked after it
  was cut off, acknowledged before the cut healed.

All but the first are computed against the longest committed log (after
convergence every node's is the same, which `diverged` checks).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from cluster.chaos.history import PROBE_PREFIX, History, Operation, Outcome
from cluster.chaos.schedule import ISOLATE_LEADER
from cluster.chaos.workload import id_of
from dledger.entry import MAGIC_NORMAL
from store.errors import MessageDecodeError
from store.system_entry import decode_system_entry

# How many examples of each violation a summary shows.
EXAMPLES = 5


@dataclass(frozen=True)
class LogEntry:
    index: int
    term: int
    body: bytes
    chain_crc: int
    magic: int = MAGIC_NORMAL   # the log's own entries (NOOP, producer marks) are compared, not counted


@dataclass(frozen=True)
class Divergence:
    node: str
    index: int
    reference_node: str
    what: str


@dataclass(frozen=True)
class OrderViolation:
    earlier_op: int       # acknowledged first
    earlier_last_index: int
    later_op: int         # invoked after that
    later_first_index: int


@dataclass
class CheckResult:
    lost: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)        # indexes
    failed_present: list[str] = field(default_factory=list)
    diverged: list[Divergence] = field(default_factory=list)
    order_violations: list[OrderViolation] = field(default_factory=list)
    stale_leader_acks: list[int] = field(default_factory=list)  # op numbers
    # Entries of the workload's unknown appends that did land (information,
    # not a failure; the isolated-leader probes are left out).
    unknown_present: int = 0
    committed_entries: int = 0
    # Entries the nodes wrote themselves through the log (the store's
    # metadata snapshots when a leader takes over): no client sent them, and
    # none is expected to.
    system_entries: int = 0

    @property
    def valid(self) -> bool:
        return not (self.lost or self.misplaced or self.duplicated or self.unexpected or self.failed_present
                    or self.diverged or self.order_violations or self.stale_leader_acks)

    def counts(self) -> dict[str, int]:
        return {"lost": len(self.lost), "misplaced": len(self.misplaced), "duplicated": len(self.duplicated),
                "unexpected": len(self.unexpected), "failed_present": len(self.failed_present),
                "diverged": len(self.diverged), "order_violations": len(self.order_violations),
                "stale_leader_acks": len(self.stale_leader_acks)}

    def examples(self) -> dict[str, list[object]]:
        shown: dict[str, list[object]] = {
            "lost": self.lost[:EXAMPLES], "misplaced": self.misplaced[:EXAMPLES],
            "duplicated": self.duplicated[:EXAMPLES], "unexpected_indexes": self.unexpected[:EXAMPLES],
            "failed_present": self.failed_present[:EXAMPLES],
            "diverged": [vars(d) for d in self.diverged[:EXAMPLES]],
            "order_violations": [vars(v) for v in self.order_violations[:EXAMPLES]],
            "stale_leader_acks": self.stale_leader_acks[:EXAMPLES]}
        return {k: v for k, v in shown.items() if v}


def check(history: History, logs: dict[str, list[LogEntry]],
          decode: Callable[[bytes], str | None] = id_of) -> CheckResult:
    result = CheckResult()
    if not logs:
        raise ValueError("no committed log to check")
    reference_node = max(logs, key=lambda n: (len(logs[n]), n))
    reference = logs[reference_node]
    result.committed_entries = len(reference)
    result.diverged = find_divergence(logs)
    where = locate_ids(reference, decode, result)
    check_operations(history.operations, where, result)
    result.order_violations = find_order_violations(history.operations, where)
    result.stale_leader_acks = find_stale_leader_acks(history)
    return result


def find_divergence(logs: dict[str, list[LogEntry]]) -> list[Divergence]:
    """Per index, the nodes whose entry differs from what most nodes hold
    there, plus holes (committed logs are contiguous)."""
    found: list[Divergence] = []
    by_node = {node: {e.index: e for e in entries} for node, entries in sorted(logs.items())}
    for node, entries in sorted(logs.items()):
        for previous, entry in zip(entries, entries[1:]):
            if entry.index != previous.index + 1:
                found.append(Divergence(node, previous.index + 1, node, "hole in the committed log"))
    for index in sorted(set().union(*by_node.values())):
        held = {node: entries[index] for node, entries in by_node.items() if index in entries}
        keys = {node: (e.term, e.magic, e.body, e.chain_crc) for node, e in held.items()}
        if len(set(keys.values())) <= 1:
            continue
        majority = Counter(keys.values()).most_common(1)[0][0]
        reference = next(node for node, key in keys.items() if key == majority)
        for node, entry in held.items():
            if keys[node] != majority:
                found.append(Divergence(node, index, reference, _difference(entry, held[reference])))
    return found


def _difference(entry: LogEntry, other: LogEntry) -> str:
    for what in ("term", "magic", "body", "chain_crc"):
        if getattr(entry, what) != getattr(other, what):
            return what
    return "none"


def locate_ids(reference: list[LogEntry], decode: Callable[[bytes], str | None],
               result: CheckResult) -> dict[str, list[int]]:
    """id -> the indexes whose bodies carry it; client entries with no id are
    unexpected (the log's own entries, NOOPs and producer marks, carry none)."""
    where: dict[str, list[int]] = defaultdict(list)
    for entry in reference:
        if entry.magic != MAGIC_NORMAL:
            continue
        op_id = decode(entry.body)
        if op_id is None and is_store_system_entry(entry.body):
            result.system_entries += 1
        elif op_id is None:
            result.unexpected.append(entry.index)
        else:
            where[op_id].append(entry.index)
    return where


def is_store_system_entry(body: bytes) -> bool:
    """A metadata entry of the node's message store (store/system_entry.py),
    which a node appends on its own."""
    try:
        decode_system_entry(body)
    except MessageDecodeError:
        return False
    return True


def check_operations(operations: list[Operation], where: dict[str, list[int]], result: CheckResult) -> None:
    invoked: set[str] = set()
    for op in operations:
        invoked.update(op.ids)
        for offset, op_id in enumerate(op.ids):
            found = where.get(op_id, [])
            if op.outcome is Outcome.OK:
                assert op.first_index is not None
                if not found:
                    result.lost.append(op_id)
                elif op.first_index + offset not in found:
                    result.misplaced.append(op_id)
            elif op.outcome is Outcome.FAIL and found:
                result.failed_present.append(op_id)
            elif op.outcome in (Outcome.UNKNOWN, Outcome.PENDING) and found \
                    and not op.client.startswith(PROBE_PREFIX):
                result.unknown_present += 1
    for op_id, indexes in where.items():
        if len(indexes) > 1:
            result.duplicated.append(op_id)
        if op_id not in invoked:
            result.unexpected.extend(indexes)
    result.unexpected.sort()


def find_order_violations(operations: list[Operation], where: dict[str, list[int]]) -> list[OrderViolation]:
    """Sweep in time order, keeping the highest index acknowledged so far:
    every operation invoked later must land above it."""
    events: list[tuple[float, int, Operation, int, int]] = []  # time, 0=invoke/1=ack, op, first, last
    for op in operations:
        span = landed_span(op, where)
        if span is None:
            continue
        events.append((op.invoke_s, 0, op, *span))
        if op.outcome is Outcome.OK and op.complete_s is not None:
            events.append((op.complete_s, 1, op, *span))
    # At equal times an invoke is not "after" the ack: process invokes first.
    events.sort(key=lambda e: (e[0], e[1]))
    highest: tuple[int, Operation] | None = None
    violations: list[OrderViolation] = []
    for _, kind, op, first, last in events:
        if kind == 1:
            if highest is None or last > highest[0]:
                highest = (last, op)
        elif highest is not None and first <= highest[0]:
            violations.append(OrderViolation(highest[1].number, highest[0], op.number, first))
    return violations


def landed_span(op: Operation, where: dict[str, list[int]]) -> tuple[int, int] | None:
    """The indexes an operation occupies: as acknowledged, or where its
    entries were found for an unknown outcome."""
    if op.outcome is Outcome.OK and op.first_index is not None and op.last_index is not None:
        return op.first_index, op.last_index
    if op.outcome in (Outcome.UNKNOWN, Outcome.PENDING):
        indexes = [i for op_id in op.ids for i in where.get(op_id, [])]
        if indexes:
            return min(indexes), max(indexes)
    return None


def find_stale_leader_acks(history: History) -> list[int]:
    stale: list[int] = []
    for window in history.faults:
        if window.kind != ISOLATE_LEADER:
            continue
        client = f"{PROBE_PREFIX}{window.targets[0]}"
        end = window.end_s if window.end_s is not None else float("inf")
        for op in history.operations:
            if (op.client == client and op.outcome is Outcome.OK and op.invoke_s >= window.start_s
                    and op.complete_s is not None and op.complete_s < end):
                stale.append(op.number)
    return stale
