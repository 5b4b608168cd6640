"""`dledger cluster up --groups 2`: two broker groups (one node each, to keep
the test light) behind a name server on the documented ports; `status`
lists the nodes of both groups from one address, and `topic create`,
`list` and `describe` work across the groups."""
from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from cluster.process_cluster import free_base_port
from tests.integration.test_cli import ROOT, dledger, dledger_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def free_group_base_port() -> int:
    """Two groups of three, the name server and front ends (`cluster up --groups 2`)."""
    return free_base_port(offset + 10 * g + i for offset in (0, 100, 300) for g in (0, 1) for i in range(3))


@pytest.fixture
def two_groups(tmp_path: Path):
    base = free_group_base_port()
    log_path = tmp_path / "nodes.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "cluster", "up", "--groups", "2", "--nodes", "1",
             "--data-dir", str(tmp_path / "data"), "--base-port", str(base)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in process.stdout],
                     daemon=True).start()
    try:
        yield base, lines, tmp_path
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def read_until(lines: "queue.Queue[str]", prefix: str, timeout: float = 60) -> list[str]:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        if line.startswith(prefix):
            return seen
    pytest.fail(f"no {prefix!r} line; got {seen}")


def test_cluster_up_with_two_groups_and_topics_across_them(two_groups):
    base, lines, tmp_path = two_groups
    printed = read_until(lines, "ready")
    assert any(line.startswith(f"namesrv grpc=127.0.0.1:{base + 90} metrics=http://127.0.0.1:{base + 190}/")
               for line in printed)
    assert any(line.startswith(f"g1n0 grpc=127.0.0.1:{base + 10} metrics=http://127.0.0.1:{base + 110}/metrics "
                               f"data={tmp_path / 'data' / 'g1n0'}") for line in printed)
    assert printed[-1].startswith("ready g0:leader=g0n0 term=") and " g1:leader=g1n0 term=" in printed[-1]

    one = f"127.0.0.1:{base}"
    # From g0's node alone, status finds g1 through the name server.
    rows = wait_for("both groups in status", lambda: (
        r := dledger_json("status", "--servers", one, "--json")["nodes"]) and len(r) == 2 and r)
    assert {(r["group"], r["id"], r["role"]) for r in rows} == {("g0", "g0n0", "LEADER"), ("g1", "g1n0", "LEADER")}

    created = json.loads(dledger("topic", "create", "--servers", one, "--topic", "Wide", "--queues", "3",
                                 "--json").stdout)
    assert created["queues"] == 6 and created["created"]
    assert [(g["group"], g["queues"]) for g in created["groups"]] == [("g0", 3), ("g1", 3)]
    only = json.loads(dledger("topic", "create", "--servers", one, "--topic", "Narrow", "--queues", "2",
                              "--groups", "g1", "--json").stdout)
    assert [(g["group"], g["queues"]) for g in only["groups"]] == [("g1", 2)]

    described = dledger_json("topic", "describe", "--servers", one, "--topic", "Narrow", "--json")
    assert [(g["group"], [q["queue_id"] for q in g["offsets"]]) for g in described["groups"]] == [("g1", [0, 1])]
    listed = {t["topic"]: t for t in dledger_json("topic", "list", "--servers", one, "--json")["topics"]}
    assert [g["group"] for g in listed["Wide"]["groups"]] == ["g0", "g1"]
    assert [g["group"] for g in listed["Narrow"]["groups"]] == ["g1"]

    unknown = dledger("topic", "create", "--servers", one, "--topic", "X", "--groups", "g7", check=False)
    assert unknown.returncode == 2 and "no broker group 'g7'" in unknown.stderr

    # `bench send` makes its topic in every group, and the producer spreads over them.
    bench = json.loads(dledger("bench", "send", "--servers", one, "--topic", "BenchWide", "--duration", "1",
                               "--inflight", "8", "--json").stdout)
    assert bench["messages"] > 0 and bench["errors"] == 0
    spread = dledger_json("topic", "describe", "--servers", one, "--topic", "BenchWide", "--json")
    assert [g["group"] for g in spread["groups"]] == ["g0", "g1"] and all(g["messages"] > 0 for g in spread["groups"])

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{base + 190}/metrics", timeout=5).read().decode()
    assert "dledger_namesrv_groups_registered 2.0" in metrics
    node_metrics = urllib.request.urlopen(f"http://127.0.0.1:{base + 110}/metrics", timeout=5).read().decode()
    assert 'dledger_namesrv_registrations_sent_total{group="g1",outcome="ok",self_id="g1n0"}' in node_metrics


def test_cluster_up_refuses_more_groups_than_its_ports_allow(tmp_path: Path):
    done = dledger("cluster", "up", "--groups", "10", "--data-dir", str(tmp_path), check=False)
    assert done.returncode == 2 and "--groups must be 1..9" in done.stderr
    done = dledger("cluster", "up", "--groups", "2", "--nodes", "11", "--data-dir", str(tmp_path), check=False)
    assert done.returncode == 2 and "--nodes must be 1..10" in done.stderr
