"""A short chaos run of each fault kind against real node processes behind
real TCP proxies: each must end with every check passed (nothing
acknowledged lost, nothing duplicated, identical committed logs, real-time
order kept, no acknowledgement from an isolated old leader), with the fault
really injected and the cluster acknowledging appends again afterwards."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.chaos.runner import ChaosOptions, run_chaos
from cluster.chaos.schedule import (BITFLIP_RUNNING, BITFLIP_STOPPED, COMBO, CRASH_WRITE, DELAY, DISK_KINDS,
                                    ISOLATE_LEADER, KILL_LEADER, KILL_RANDOM, MEMBER_CHANGE, ONE_WAY,
                                    PAUSE_LEADER, SPLIT, WIPE_DISK, ScheduleConfig)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# One fault per run: 1 s of load, the fault, then 0.5 s of healthy load.
SHORT = ScheduleConfig(warmup_s=1.0, fault_s=(1.5, 2.5), quiet_s=(0.5, 1.0), min_pause_s=3.0, cooldown_s=0.5)
DURATION_S = 4.5
# A seed whose four membership changes are a move, a replacement, an add and
# a removal, the last two with the leader killed in their middle.
MEMBERSHIP_SEED = 20


async def short_run(kind: str, out: Path, seed: int, duration_s: float = DURATION_S,
                    schedule: ScheduleConfig = SHORT) -> dict[str, Any]:
    summary = await run_chaos(ChaosOptions(out_dir=out, duration_s=duration_s, faults=(kind,), seed=seed,
                                           schedule=schedule, convergence_timeout_s=20.0))
    assert summary["valid"], json.dumps(summary, indent=1)
    assert summary["faults_injected"] >= 1
    assert all(f["recovery_s"] is not None for f in summary["per_fault"]), "no ack after a fault"
    assert summary["lost"] == summary["duplicated"] == summary["diverged"] == summary["order_violations"] == 0
    return summary


@pytest.mark.parametrize("kind", [KILL_LEADER, KILL_RANDOM, SPLIT, ONE_WAY, DELAY])
async def test_short_run_passes_every_check(kind: str, tmp_path: Path):
    summary = await short_run(kind, tmp_path, seed=5)
    assert {f["kind"] for f in summary["per_fault"]} == {kind}
    assert summary["acked"] > 50
    if kind in (SPLIT, ONE_WAY):
        assert summary["peer_traffic"]["dropped_bytes"] > 0   # the partition hit live peer traffic


async def test_crash_in_the_middle_of_heavy_appends_loses_nothing(tmp_path: Path):
    summary = await short_run(CRASH_WRITE, tmp_path, seed=5)
    # Heavy mode appended batches: many more entries than operations.
    assert summary["acked_entries"] > 5 * summary["acked"]


async def test_isolated_leader_acknowledges_nothing(tmp_path: Path):
    summary = await short_run(ISOLATE_LEADER, tmp_path, seed=5)
    assert summary["probe_ops"] >= 5          # the old leader really was asked
    assert summary["stale_leader_acks"] == 0
    assert summary["peer_traffic"]["dropped_bytes"] > 0


async def test_paused_leader_is_replaced_before_it_resumes(tmp_path: Path):
    # Clients see a new leader about 2.5 s into the pause (a 1.5 s call
    # timeout, then a discovery that waits 1 s for the frozen node): pause 4 s.
    summary = await short_run(PAUSE_LEADER, tmp_path, seed=5, duration_s=5.5,
                              schedule=replace(SHORT, min_pause_s=4.0))
    (fault,) = summary["per_fault"]
    # start_s/end_s are rounded to milliseconds in the summary: allow for it.
    assert fault["end_s"] - fault["start_s"] >= 4.0 - 0.002
    # A new leader acknowledged appends while the old one was frozen.
    assert fault["recovery_s"] < fault["end_s"] - fault["start_s"]


async def test_combined_faults_pass_every_check(tmp_path: Path):
    summary = await short_run(COMBO, tmp_path, seed=8, duration_s=5.0)
    assert len(summary["per_fault"]) == 2


@pytest.mark.parametrize("kind", DISK_KINDS)
async def test_storage_faults_are_repaired_and_lose_nothing(kind: str, tmp_path: Path):
    summary = await short_run(kind, tmp_path, seed=7)
    (fault,) = summary["per_fault"]
    assert fault["kind"] == kind
    assert summary["unsafe_repair_votes"] == 0 and not summary["still_repairing"]
    if kind in (BITFLIP_STOPPED, BITFLIP_RUNNING, WIPE_DISK):
        # The damaged (or emptied) node noticed, repaired itself and finished.
        assert summary["repairs"] >= 1 and summary["repairs_completed"] >= 1, json.dumps(summary, indent=1)


async def test_membership_changes_under_load_lose_nothing(tmp_path: Path):
    # Four changes back to back, each waited out (a fault lasts as long as
    # its change): every kind of change, and the leader killed mid-change.
    schedule = replace(SHORT, fault_s=(1.0, 1.5), quiet_s=(0.3, 0.5))
    summary = await short_run(MEMBER_CHANGE, tmp_path, seed=MEMBERSHIP_SEED, duration_s=8.0, schedule=schedule)
    details = [f["detail"] for f in summary["per_fault"]]
    assert summary["member_changes"] == summary["member_changes_completed"] == 4, details
    assert {d.split()[0] for d in details} == {"add", "remove", "replace", "move"}, details
    assert sum("killed" in d for d in details) == 2, details
    assert summary["acked"] > 50 and not summary["unconverged_nodes"]
