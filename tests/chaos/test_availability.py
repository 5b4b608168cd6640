"""Unavailability and recovery times from a hand-made history."""
from __future__ import annotations

import pytest

from cluster.chaos.availability import longest_gap, recoveries
from cluster.chaos.history import FaultWindow, History, Operation, Outcome


def history_with_a_failover() -> History:
    history = History(started_at=0.0)
    ok = Outcome.OK
    history.operations = [
        Operation(1, "c0", ("a",), 0.0, 0.5, ok, 1),
        Operation(2, "c0", ("b",), 0.9, 3.0, Outcome.UNKNOWN),   # in flight on the killed leader
        Operation(3, "c1", ("c",), 1.2, 2.6, ok, 3),             # the first ack after the kill
        Operation(4, "probe-n0", ("p",), 1.1, 1.15, ok, 2),      # probes are not the workload
        Operation(5, "c1", ("d",), 2.7, 2.8, ok, 4),
        Operation(6, "c0", ("e",), 4.2, 4.3, ok, 5),             # the first ack after the heal
    ]
    history.faults = [FaultWindow(1, "kill-leader", ("n0",), 1.0, 4.0)]
    return history


def test_longest_gap_is_the_longest_time_without_a_workload_acknowledgement():
    gap = longest_gap(history_with_a_failover(), 0.0, 5.0)
    assert gap.seconds == pytest.approx(2.1)
    assert (gap.from_s, gap.to_s) == (0.5, 2.6)


def test_recovery_counts_from_the_fault_to_the_first_ack_of_an_append_invoked_after_it():
    (recovery,) = recoveries(history_with_a_failover())
    assert recovery.recovery_s == pytest.approx(1.6)    # 2.6 - 1.0 (op 1 was invoked before the kill)
    assert recovery.after_heal_s == pytest.approx(0.3)  # 4.3 - 4.0
