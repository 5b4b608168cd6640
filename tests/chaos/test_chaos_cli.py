"""`dledger chaos` as a user runs it: the summary JSON is the last line of
stdout, the exit code says the verdict, and the history and the timeline
are written where --out says."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.chaos.history import Outcome, load_history
from cluster.process_cluster import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dledger(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_chaos_command_prints_the_summary_last_and_writes_history_and_timeline(tmp_path: Path):
    out = tmp_path / "run"
    done = dledger("chaos", "--duration", "4", "--faults", "kill-leader", "--seed", "11",
                   "--out", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["seed"] == 11 and summary["valid"] is True
    for key in ("ops", "acked", "failed", "unknown", "lost", "duplicated", "diverged", "order_violations",
                "max_unavailability_s", "per_fault"):
        assert key in summary
    history = load_history(out / "history.jsonl")
    assert len([op for op in history.operations if op.outcome is Outcome.OK]) == summary["acked"]
    assert [w.kind for w in history.faults] == ["kill-leader"]
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "data").exists()   # removed after a valid run
    assert {p.name for p in (out / "nodes").iterdir()} == {"n0.log", "n1.log", "n2.log"}


def test_chaos_command_without_idempotence_passes_every_check(tmp_path: Path):
    # Without a producer id nothing is retried once it may have been
    # applied, so the last answer decides: a kill gives unknown outcomes, and
    # only NOT_LEADER-like answers are failures (which must not be in the log).
    done = dledger("chaos", "--duration", "4", "--faults", "kill-leader", "--seed", "11", "--no-idempotence",
                   "--out", str(tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["valid"] and summary["failed_present"] == 0 and summary["duplicated"] == 0


def test_broker_workload_options_are_built_from_the_arguments():
    from cluster.chaos.broker_workload import BrokerWorkloadConfig
    from cluster.chaos.command import options_from
    from cluster.cli import build_parser

    args = build_parser().parse_args(["chaos", "--workload", "broker", "--no-official", "--clients", "2"])
    options = options_from(args)
    assert options.workload == "broker"
    assert options.workload_config == BrokerWorkloadConfig(producers=2, official=False)


def test_unknown_fault_is_a_usage_error(tmp_path: Path):
    done = dledger("chaos", "--faults", "kill,meteor", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "unknown fault 'meteor'" in done.stderr
