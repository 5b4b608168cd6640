"""How available the cluster stayed: the longest stretch without an
acknowledgement, and per fault the time until the cluster acknowledged again.

Only the workload's own writes count (appends, or the broker workload's
sends; not the isolated-leader probe, which is aimed at a node that must not
answer). For the broker workload the same measures are also taken on
deliveries: the longest time without a delivered message, and per fault the
time until a receive invoked after it delivered one.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from cluster.chaos.history import PROBE_PREFIX, FaultWindow, History, Operation, Outcome


@dataclass(frozen=True)
class Gap:
    seconds: float
    from_s: float
    to_s: float


@dataclass
class FaultRecovery:
    fault: int
    kind: str
    targets: tuple[str, ...]
    detail: str
    start_s: float
    end_s: float | None
    in_combo: bool
    # Fault start -> the first acknowledgement of an append invoked after it
    # (for a leader kill: the failover time as a client sees it).
    recovery_s: float | None
    # Heal -> the first acknowledgement of an append invoked after the heal.
    after_heal_s: float | None
    # The broker workload: fault start -> the first message delivered by a
    # receive invoked after it.
    delivery_recovery_s: float | None = None

# Operations whose acknowledgements measure availability.
WRITE_KINDS = ("append", "send")


def workload_acks(history: History) -> list[Operation]:
    acks = [op for op in history.operations
            if op.outcome is Outcome.OK and op.complete_s is not None and op.kind in WRITE_KINDS
            and not op.client.startswith(PROBE_PREFIX)]
    return sorted(acks, key=lambda op: op.complete_s or 0.0)


def longest_gap(history: History, start_s: float, end_s: float) -> Gap:
    """The longest time in [start_s, end_s] with no acknowledgement."""
    times = [op.complete_s for op in workload_acks(history) if start_s <= (op.complete_s or 0.0) <= end_s]
    points = [start_s, *[t for t in times if t is not None], end_s]
    best = Gap(0.0, start_s, start_s)
    for before, after in zip(points, points[1:]):
        if after - before > best.seconds:
            best = Gap(after - before, before, after)
    return best


def longest_delivery_gap(history: History, start_s: float, end_s: float) -> Gap:
    """The longest time in [start_s, end_s] with no message delivered."""
    times = sorted(d.time_s for d in history.deliveries if start_s <= d.time_s <= end_s)
    points = [start_s, *times, end_s]
    best = Gap(0.0, start_s, start_s)
    for before, after in zip(points, points[1:]):
        if after - before > best.seconds:
            best = Gap(after - before, before, after)
    return best


def first_delivery_after(history: History, moment: float) -> float | None:
    times = [d.time_s for d in history.deliveries if d.receive_invoke_s >= moment]
    return min(times) - moment if times else None


def first_ack_after(acks: list[Operation], moment: float) -> float | None:
    times = [op.complete_s for op in acks if op.invoke_s >= moment and op.complete_s is not None]
    return min(times) - moment if times else None


def recoveries(history: History) -> list[FaultRecovery]:
    acks = workload_acks(history)
    found = [recovery_of(window, acks) for window in history.faults]
    if history.deliveries:
        for row in found:
            row.delivery_recovery_s = first_delivery_after(history, row.start_s)
    return found


def recovery_of(window: FaultWindow, acks: list[Operation]) -> FaultRecovery:
    after_heal = first_ack_after(acks, window.end_s) if window.end_s is not None else None
    return FaultRecovery(window.number, window.kind, window.targets, window.detail, window.start_s,
                         window.end_s, window.in_combo, first_ack_after(acks, window.start_s), after_heal)


def recovery_stats(items: list[FaultRecovery], kinds: tuple[str, ...] | None = None,
                   solo: bool = False, measure: str = "recovery_s") -> dict[str, float | int | None]:
    """Count, median and worst recovery of the faults of `kinds` (all when
    None); `solo` leaves out the parts of combined faults; `measure` is the
    FaultRecovery field (recovery_s, or delivery_recovery_s)."""
    times = [getattr(r, measure) for r in items
             if getattr(r, measure) is not None and (kinds is None or r.kind in kinds) and not (solo and r.in_combo)]
    if not times:
        return {"count": 0, "median_s": None, "worst_s": None}
    return {"count": len(times), "median_s": round(statistics.median(times), 3), "worst_s": round(max(times), 3)}


def recovery_by_kind(items: list[FaultRecovery], measure: str = "recovery_s"
                     ) -> dict[str, dict[str, float | int | None]]:
    """Per fault kind, faults on their own only (a combo's parts overlap)."""
    kinds = sorted({r.kind for r in items if not r.in_combo})
    return {kind: recovery_stats(items, (kind,), solo=True, measure=measure) for kind in kinds}
