"""The nemesis schedule is a pure function of the seed, the fault kinds and
the duration: a failing run can be replayed."""
from __future__ import annotations

import pytest

from cluster.chaos.schedule import (ALL_KINDS, BASE_KINDS, COMBO, KILL_LEADER, PAUSE_LEADER, ScheduleConfig,
                                    parse_faults, plan_schedule)


def test_same_seed_gives_the_same_schedule():
    assert plan_schedule(42, ALL_KINDS, 120.0) == plan_schedule(42, ALL_KINDS, 120.0)


def test_different_seeds_give_different_schedules():
    assert plan_schedule(1, ALL_KINDS, 120.0) != plan_schedule(2, ALL_KINDS, 120.0)


def test_schedule_uses_only_the_kinds_asked_for_and_fits_the_duration():
    config = ScheduleConfig()
    plan = plan_schedule(7, ("split", "one-way"), 60.0, config)
    assert {f.kind for f in plan} <= {"split", "one-way"}
    assert len(plan) >= 5
    for fault in plan:
        assert fault.at_s + fault.duration_s <= 60.0 - config.cooldown_s
    for before, after in zip(plan, plan[1:]):
        assert after.at_s >= before.at_s + before.duration_s + config.quiet_s[0]


def test_pause_outlasts_the_minimum_pause():
    plan = plan_schedule(3, (PAUSE_LEADER,), 60.0, ScheduleConfig(fault_s=(0.5, 1.0), min_pause_s=2.5))
    assert plan and all(f.duration_s >= 2.5 for f in plan)


def test_short_run_still_gets_one_fault():
    plan = plan_schedule(5, (KILL_LEADER,), 3.0, ScheduleConfig(warmup_s=1.0, cooldown_s=0.5))
    assert len(plan) == 1


def test_combo_combines_two_distinct_kinds():
    plan = plan_schedule(11, (COMBO,), 200.0)
    assert plan
    for fault in plan:
        assert len(set(fault.parts)) == 2 and set(fault.parts) <= set(BASE_KINDS)
        assert 0 <= fault.stagger_s <= fault.duration_s / 2


def test_fault_groups_expand_and_unknown_names_are_refused():
    assert parse_faults("kill") == ("kill-leader", "kill-random", "crash-write")
    assert parse_faults("pause,split") == ("split", "pause-leader")
    # `all` is what it was before membership changes existed (its seeds plan the same schedules).
    assert parse_faults("all") == tuple(k for k in ALL_KINDS if k != "member-change")
    assert parse_faults("membership,kill-leader") == ("kill-leader", "member-change")
    with pytest.raises(ValueError, match="unknown fault 'nuke'"):
        parse_faults("kill,nuke")
