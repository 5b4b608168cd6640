"""The `dledger` CLI against a real three-node cluster started with
`dledger cluster up`: the command forms and JSON that outside tools rely on."""
from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster import process_cluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as rmq
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STATUS_KEYS = {"id", "address", "pid", "role", "term", "leader_id", "ledger_begin_index",
               "ledger_end_index", "committed_index", "metrics_address", "repairing", "repair_until",
               "no_intact_copy"}
ENTRY_KEYS = {"index", "term", "body_base64"}


def free_base_port(nodes: int) -> int:
    """A base port whose gRPC, metrics, members' (mutual TLS, `--secure`)
    and front-end ports (base+i, base+100+i, base+200+i, base+300+i) are
    free (without base+200, a secured `cluster up` once met a peer port in
    use)."""
    return process_cluster.free_base_port(offset + i for offset in (0, 100, 200, 300) for i in range(nodes))


def dledger(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"dledger {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def dledger_json(*args: str) -> Any:
    return json.loads(dledger(*args).stdout)


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@dataclass
class LocalCluster:
    process: subprocess.Popen
    servers: str
    lines: "queue.Queue[str]"
    log_path: Path

    def status(self) -> list[dict[str, Any]]:
        return dledger_json("status", "--servers", self.servers, "--json")["nodes"]

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line
        pytest.fail(f"launcher printed no {prefix!r} line; node logs:\n{self.log_path.read_text()[-4000:]}")


@pytest.fixture
def cluster(tmp_path: Path):
    base = free_base_port(3)
    log_path = tmp_path / "nodes.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "cluster", "up", "--nodes", "3",
             "--data-dir", str(tmp_path / "data"), "--base-port", str(base)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l.rstrip("\n")) for l in process.stdout],
                     daemon=True).start()
    servers = ",".join(f"127.0.0.1:{base + i}" for i in range(3))
    local = LocalCluster(process, servers, lines, log_path)
    try:
        yield local
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def one_leader(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    leaders = [r for r in rows if r["role"] == "LEADER"]
    if len(leaders) != 1 or any(r["leader_id"] != leaders[0]["id"] for r in rows):
        return None
    return leaders[0]


def test_cli_drives_a_local_three_node_cluster(cluster: LocalCluster, tmp_path: Path):
    cluster.wait_line("ready")

    # status: one row per node with exactly the documented keys, one leader.
    rows = cluster.status()
    assert sorted(r["id"] for r in rows) == ["n0", "n1", "n2"]
    assert all(set(r) == STATUS_KEYS for r in rows)
    leader = wait_for("one agreed leader", lambda: one_leader(cluster.status()))
    for row in rows:
        assert isinstance(row["pid"], int) and row["metrics_address"].startswith("127.0.0.1:")
        assert Path(tmp_path / "data" / row["id"]).is_dir()

    # append --count --size: every entry committed, in order. The log's own
    # entries (a producer mark before each batch of 1000) sit between them.
    appended = dledger_json("append", "--servers", cluster.servers, "--count", "2000",
                            "--size", "100", "--json")
    assert set(appended) == {"appended", "first_index", "last_index"}
    assert appended["appended"] == 2000
    first, last = appended["first_index"], appended["last_index"]
    assert last - first == 2000  # 2000 entries and the mark opening the second batch

    # get: the first of them, body as the CLI generated it.
    entry = dledger_json("get", "--servers", cluster.servers, "--index", str(first), "--json")
    assert set(entry) == ENTRY_KEYS and entry["index"] == first
    assert base64.b64decode(entry["body_base64"]) == b"0".rjust(100, b".")

    # read --from a follower: its own committed log holds the same entries.
    follower = next(r["id"] for r in rows if r["id"] != leader["id"])
    wait_for(f"{follower} to learn the commit index", lambda: next(
        r for r in cluster.status() if r["id"] == follower)["committed_index"] >= last)
    lines = dledger("read", "--servers", cluster.servers, "--from", follower, "--json").stdout.splitlines()
    from_follower = [json.loads(line) for line in lines]
    assert all(set(e) == ENTRY_KEYS for e in from_follower)
    indexes = [e["index"] for e in from_follower]
    assert indexes == sorted(set(indexes))
    ours = [e for e in from_follower if first <= e["index"] <= last]
    every = [json.loads(line) for line in dledger("read", "--servers", cluster.servers, "--from", follower,
                                                   "--all", "--json").stdout.splitlines()]
    assert [e["index"] for e in every] == list(range(every[0]["index"], every[0]["index"] + len(every)))
    assert [base64.b64decode(e["body_base64"]) for e in ours] == \
        [str(i).encode().rjust(100, b".") for i in range(2000)]
    from_leader = [json.loads(line) for line in dledger(
        "read", "--servers", cluster.servers, "--start", str(first), "--end", str(last),
        "--json").stdout.splitlines()]
    assert from_leader == ours

    # metrics and health are served.
    with urllib.request.urlopen(f"http://{leader['metrics_address']}/metrics", timeout=5) as page:
        text = page.read().decode()
    assert f'dledger_role{{group="default",role="LEADER",self_id="{leader["id"]}"}} 1.0' in text
    assert "dledger_append_latency_seconds_bucket" in text
    # The leader replicates over peer links (the followers named their ports).
    me = f'self_id="{leader["id"]}"'
    assert f'dledger_peer_links_open{{group="default",{me}}} 2.0' in text, text[-3000:]
    assert f'dledger_peer_link_dials_total{{group="default",outcome="refused",{me}}} 0.0' in text
    link_requests = re.search(rf'dledger_peer_requests_total{{group="default",path="link",{me}}} (\S+)', text)
    assert link_requests and float(link_requests.group(1)) > 0
    # A follower relays the calls it forwards to the leader on one stream, and says so.
    with grpc.insecure_channel(next(r["address"] for r in rows if r["id"] == follower)) as channel:
        sent = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(spb.SendMessageRequest(messages=[
            rmq.Message(topic=rmq.Resource(name="CliRelay"), body=b"relayed", system_properties=rmq.SystemProperties(
                message_id="01" + "AB" * 16, born_host="127.0.0.1"))]), metadata=[("x-mq-client-id", "cli-test")],
            timeout=10)
    assert sent.status.code == rmq.OK, sent.status
    follower_metrics = next(r["metrics_address"] for r in rows if r["id"] == follower)
    with urllib.request.urlopen(f"http://{follower_metrics}/metrics", timeout=5) as page:
        text = page.read().decode()
    assert f'dledger_relay_calls_total{{group="default",self_id="{follower}"}} 1.0' in text, text[-3000:]
    assert f'dledger_relay_messages_total{{group="default",self_id="{follower}"}} 1.0' in text
    assert f'dledger_forwarded_calls_abandoned_total{{group="default",self_id="{follower}"}} 0.0' in text
    with grpc.insecure_channel(leader["address"]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "dledger.v1.DLedgerService"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

    # leader transfer: the named follower becomes leader.
    dledger("leader", "transfer", "--servers", cluster.servers, "--to", follower)
    new_leader = wait_for(f"{follower} to lead", lambda: (
        lambda found: found if found and found["id"] == follower else None)(one_leader(cluster.status())))
    assert new_leader["term"] > leader["term"]
    appended = dledger_json("append", "--servers", cluster.servers, "--data", "after transfer", "--json")
    assert appended["appended"] == 1 and appended["first_index"] > last
    entry = dledger_json("get", "--servers", cluster.servers, "--index", str(appended["first_index"]),
                         "--json")
    assert base64.b64decode(entry["body_base64"]) == b"after transfer"

    # Errors: a readable message and exit code 1.
    failed = dledger("get", "--servers", cluster.servers, "--index", "999999999", "--json", check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("dledger get: error:")

    # SIGTERM stops every node cleanly.
    pids = [r["pid"] for r in cluster.status()]
    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.process.wait(30) == 0
    cluster.wait_line("stopped", timeout=1)
    assert not any(pid_alive(pid) for pid in pids)
    logs = cluster.log_path.read_text()
    for node_id in ("n0", "n1", "n2"):
        assert f"[{node_id}]" in logs and "node stopped" in logs
    assert "Traceback" not in logs, logs[-4000:]
