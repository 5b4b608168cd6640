"""A short broker-workload chaos run of each fault kind against real node
processes behind real TCP proxies: sends, FIFO, delayed and transactional
messages, consumer groups with redeliveries and dead letters, and (in the
leader kill) the official Python client; each run must pass every broker
check (nothing acknowledged lost or missed by a group, no delivery after an
acknowledged ack, no duplicate send, FIFO order, no early delayed message,
transactions as decided, no early dead letter, identical logs and derived
state on every node), with the fault really injected and sends and
deliveries recovering after it, our clients' calls on messaging links."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.chaos.broker_checker import BrokerCheckResult
from cluster.chaos.broker_workload import BrokerWorkloadConfig
from cluster.chaos.runner import ChaosOptions, run_chaos
from cluster.chaos.schedule import (COMBO, CRASH_WRITE, DELAY, ISOLATE_LEADER, KILL_LEADER, KILL_RANDOM, ONE_WAY,
                                    PAUSE_LEADER, SPLIT, ScheduleConfig)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# One fault per run: 1.5 s of load, the fault, then healthy load.
SHORT = ScheduleConfig(warmup_s=1.5, fault_s=(1.5, 2.5), quiet_s=(0.5, 1.0), min_pause_s=3.0, cooldown_s=0.5)
DURATION_S = 5.0
# The official client's process costs seconds of CPU to start: only the
# leader kill, the case it is there for, runs it.
# The drain stops after 15 s: a transaction whose first check-back found no
# producer connected (the leader changed under it) is asked again only an
# interval (30 s) later; the checker holds undecided ones to nothing.
# A fault can hold the sequential producers for seconds, so a short run may
# send only some 60 normal messages: at the default 3% share, about one run
# in six had none left unacked, hence no dead letter to check (seen in CI).
# At 15% that chance is below 1 in 10,000.
WORKLOAD = BrokerWorkloadConfig(official=False, drain_s=15.0, never_ack_share=0.15)


async def short_run(kind: str, out: Path, seed: int, duration_s: float = DURATION_S,
                    schedule: ScheduleConfig = SHORT, workload: BrokerWorkloadConfig = WORKLOAD,
                    secure: bool = False) -> dict[str, Any]:
    summary = await run_chaos(ChaosOptions(out_dir=out, duration_s=duration_s, faults=(kind,), seed=seed,
                                           workload="broker", workload_config=workload, schedule=schedule,
                                           convergence_timeout_s=20.0, secure=secure))
    assert summary["valid"], json.dumps({k: summary[k] for k in ("examples", "calls", "crashed_nodes",
                                                                   "unconverged_nodes", "per_fault")}, indent=1)
    assert all(summary[name] == 0 for name in BrokerCheckResult.FAILURES)
    assert summary["faults_injected"] >= 1
    assert all(f["recovery_s"] is not None and f["delivery_recovery_s"] is not None for f in summary["per_fault"])
    kinds = summary["messages_by_kind"]
    assert {"normal", "fifo", "delay", "txn"} <= set(kinds), kinds
    assert summary["state_items_compared"] > 10
    # Our clients' calls went on the messaging links (TLS ones in the secure
    # run) as well as on gRPC: the faults met both.
    assert summary["client_call_paths"]["link"] > 0, summary["client_call_paths"]
    return summary


async def test_leader_kill_with_the_official_client(tmp_path: Path):
    summary = await short_run(KILL_LEADER, tmp_path, seed=5, workload=replace(WORKLOAD, official=True))
    # It sent, and lost none (under the full suite's load it once sent exactly
    # 10 in the 5 s: its process takes seconds of CPU to start).
    assert summary["official_sends"]["ok"] >= 5
    assert summary["official_sends"]["fail"] == summary["official_sends"]["unknown"] == 0
    assert summary["calls"]["send"]["fail"] == 0
    # Routed to the front ends, the official client's connections outlive the kill.
    assert summary["front_ends"] and summary["official_failed_calls"] == {"send": 0, "receive": 0, "ack": 0}


async def test_a_secured_cluster_passes_the_leader_kill_run(tmp_path: Path):
    """`dledger chaos --secure`: TLS, mutual TLS between peers through the
    fault proxies, signatures and ACLs; our clients and the official one
    sign as admin and trust the run's CA."""
    summary = await short_run(KILL_LEADER, tmp_path, seed=5, workload=replace(WORKLOAD, official=True), secure=True)
    assert summary["secure"] and summary["peer_traffic"]["forwarded_bytes"] > 0
    # At least a few sends (its process takes seconds of CPU to start; under
    # the full suite's load CI once saw 9 in the 5 s), none lost.
    assert summary["official_sends"]["ok"] >= 5
    assert summary["official_sends"]["fail"] == summary["official_sends"]["unknown"] == 0
    assert summary["calls"]["send"]["fail"] == 0
    assert "tls=mutual" in (tmp_path / "nodes" / "n0.log").read_text()


@pytest.mark.parametrize("kind", [KILL_RANDOM, CRASH_WRITE, ISOLATE_LEADER, SPLIT, ONE_WAY, DELAY, COMBO])
async def test_short_broker_run_passes_every_check(kind: str, tmp_path: Path):
    summary = await short_run(kind, tmp_path, seed=5)
    assert summary["dead_lettered"] > 0 and summary["redeliveries"] > 0
    if kind in (SPLIT, ONE_WAY, ISOLATE_LEADER):
        assert summary["peer_traffic"]["dropped_bytes"] > 0


async def test_paused_leader_broker_run(tmp_path: Path):
    # Long enough that a new leader serves clients before the old one resumes
    # even when the machine is loaded (about 2.5-4 s).
    summary = await short_run(PAUSE_LEADER, tmp_path, seed=5, duration_s=8.0,
                              schedule=replace(SHORT, min_pause_s=5.5))
    (fault,) = summary["per_fault"]
    assert fault["recovery_s"] < fault["end_s"] - fault["start_s"]
