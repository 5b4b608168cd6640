"""The node configuration (flags, TOML), the CLI's output shapes, the
launcher's plan, the metrics and the client's leader-following — all without
the real server: the client is driven against small fake gRPC nodes."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from cluster import cli
from cluster.bench import BenchResult, percentile
from cluster.config import ConfigError, add_node_arguments, build_config, config_from_args
from cluster.launcher import check_data_dirs, node_command, peers_flag, plan_nodes
from cluster.metrics import NodeMetrics
from dledger.client import DLedgerClient, node_status_row, parse_servers
from dledger.config import FlushMode
from dledger.errors import DLedgerError, ResponseCode
from dledger.membership import MembershipLog
from dledger.status import NodeStatus, PeerStatus
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

PEERS = "n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913"
STATUS_KEYS = ["id", "address", "pid", "role", "term", "leader_id", "ledger_begin_index",
               "ledger_end_index", "committed_index", "metrics_address", "repairing", "repair_until",
               "no_intact_copy"]


def node_args(*argv: str):
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


# ------------------------------------------------------------ node config

def test_flags_build_a_config_with_the_metrics_address_on_loopback(tmp_path):
    config = node_args("--id", "n1", "--peers", PEERS, "--data-dir", str(tmp_path),
                       "--metrics-port", "21012")
    assert config.self_id == "n1"
    assert [p.id for p in config.peers] == ["n0", "n1", "n2"]
    assert config.self_peer.address == "127.0.0.1:20912"
    assert config.data_dir == str(tmp_path)
    assert config.metrics_address == "127.0.0.1:21012"
    assert config.group == "default"
    assert config.flush_mode is FlushMode.SYNC


def test_advertised_addresses_and_metrics_host_for_containers(tmp_path):
    config = node_args("--id", "n1", "--peers", "n0=n0:20911,n1=n1:20911,n2=n2:20911",
                       "--data-dir", str(tmp_path), "--metrics-port", "21011", "--metrics-host", "0.0.0.0",
                       "--advertised-addresses", "n0=127.0.0.1:20911,n1=127.0.0.1:20912")
    assert config.self_peer.address == "n1:20911"          # where it listens and peers call it
    assert config.client_address_of("n1") == "127.0.0.1:20912"
    assert config.client_address_of("n2") == "n2:20911"    # not advertised: the peer address
    assert config.metrics_address == "0.0.0.0:21011"
    with pytest.raises(ConfigError, match="unknown nodes: n9"):
        node_args("--id", "n1", "--peers", PEERS, "--data-dir", str(tmp_path),
                  "--advertised-addresses", "n9=127.0.0.1:1")


def test_peer_routes_dial_a_proxy_for_a_peer_address_and_nothing_else(tmp_path):
    config = node_args("--id", "n0", "--peers", PEERS, "--data-dir", str(tmp_path),
                       "--peer-routes", "127.0.0.1:20912=127.0.0.1:40001,127.0.0.1:30000=127.0.0.1:40002")
    assert config.dial_address("127.0.0.1:20912") == "127.0.0.1:40001"
    assert config.dial_address("127.0.0.1:30000") == "127.0.0.1:40002"   # an address a member may move to
    assert config.dial_address("127.0.0.1:20913") == "127.0.0.1:20913"
    with pytest.raises(ConfigError, match="expected HOST:PORT=HOST:PORT"):
        node_args("--id", "n0", "--peers", PEERS, "--data-dir", str(tmp_path), "--peer-routes", "127.0.0.1:1")


def test_tuning_flags_are_converted_to_the_field_types(tmp_path):
    config = node_args("--id", "n0", "--peers", PEERS, "--data-dir", str(tmp_path),
                       "--flush-mode", "ASYNC", "--data-file-size", "67108864",
                       "--heartbeat-interval", "0.05", "--preallocate", "false")
    assert config.flush_mode is FlushMode.ASYNC
    assert config.data_file_size == 64 << 20
    assert config.heartbeat_interval_s == 0.05
    assert config.preallocate is False
    assert config.metrics_address == ""


def test_toml_keys_are_field_names_and_flags_override_them(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(
        'self_id = "n0"\n'
        f'data_dir = "{tmp_path}"\n'
        'group = "g1"\n'
        'flush_mode = "async"\n'
        "election_timeout_min_s = 1\n"
        "election_timeout_max_s = 2.0\n"
        'metrics_address = "127.0.0.1:9000"\n'
        "[peers]\n"
        'n0 = "127.0.0.1:30001"\n'
        'n1 = "127.0.0.1:30002"\n'
        'n2 = "127.0.0.1:30003"\n')
    config = node_args("--config", str(path), "--id", "n2", "--group", "g2")
    assert config.self_id == "n2"  # flag wins
    assert config.group == "g2"    # flag wins
    assert config.flush_mode is FlushMode.ASYNC
    assert config.election_timeout_min_s == 1.0 and isinstance(config.election_timeout_min_s, float)
    assert config.self_peer.port == 30003
    assert config.metrics_address == "127.0.0.1:9000"


def test_toml_peers_may_be_a_string_or_a_list(tmp_path):
    for peers in (f'"{PEERS}"', '["n0=127.0.0.1:20911", "n1=127.0.0.1:20912"]'):
        path = tmp_path / "node.toml"
        path.write_text(f'self_id = "n0"\ndata_dir = "d"\npeers = {peers}\n')
        assert node_args("--config", str(path)).self_peer.address == "127.0.0.1:20911"


@pytest.mark.parametrize("values, fragment", [
    ({"peers": PEERS, "data_dir": "d"}, "missing --id"),
    ({"self_id": "n0", "data_dir": "d"}, "missing --peers"),
    ({"self_id": "n0", "peers": PEERS}, "missing --data-dir"),
    ({"self_id": "n9", "peers": PEERS, "data_dir": "d"}, "not among the peers"),
    ({"self_id": "n0", "peers": "n0=127.0.0.1", "data_dir": "d"}, "expected ID=HOST:PORT"),
    ({"self_id": "n0", "peers": "n0=h:1,n0=h:2", "data_dir": "d"}, "duplicate peer ids"),
    ({"self_id": "n0", "peers": "n0=h:70000", "data_dir": "d"}, "out of range"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "flush_mode": "never"}, "flush_mode"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "data_file_size": "big"}, "data_file_size"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "data_file_size": 1.5}, "expected an integer"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "heartbeat_interval_s": -1}, "negative"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "preallocate": "maybe"}, "preallocate"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "color": "red"}, "unknown setting 'color'"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "heartbeat_interval_s": 0.4}, "heartbeat"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "peer_push_quota_bytes_per_s": 0}, "must be positive"),
    ({"self_id": "n0", "peers": PEERS, "data_dir": "d", "peer_push_throttle_busy_s": -1}, "negative"),
])
def test_bad_settings_fail_with_one_line_naming_the_problem(values, fragment):
    with pytest.raises(ConfigError) as raised:
        build_config(values)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_unreadable_toml_files_fail_with_one_line(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        node_args("--config", str(tmp_path / "missing.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("self_id = \n")
    with pytest.raises(ConfigError, match="broken.toml"):
        node_args("--config", str(broken))


def test_node_command_reports_config_errors_as_usage_errors(capsys):
    assert cli.run(["node", "--id", "n5", "--peers", PEERS, "--data-dir", "d"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dledger node: error:") and "n5" in err


# -------------------------------------------------------------- CLI usage

@pytest.mark.parametrize("argv", [
    ["append", "--servers", "127.0.0.1:1", "--count", "3"],          # --count needs --size
    ["append", "--servers", "127.0.0.1:1", "--data", "x", "--count", "1", "--size", "1"],
    ["status", "--servers", "nohostport", "--json"],
    ["status", "--servers", "h:99999"],
    ["get", "--servers", "127.0.0.1:1"],                             # --index missing
    ["bench", "append", "--servers", "h:1", "--size", "1", "--inflight", "0", "--duration", "1"],
    ["cluster", "up", "--nodes", "0"],
    ["leader", "transfer", "--servers", "h:1"],
])
def test_usage_errors_exit_with_code_2(argv):
    with pytest.raises(SystemExit) as raised:
        cli.run(argv)
    assert raised.value.code == 2


def test_cluster_up_rejects_ports_beyond_65535(capsys):
    assert cli.run(["cluster", "up", "--base-port", "65500"]) == 2
    assert "65535" in capsys.readouterr().err


def test_parse_servers_keeps_order_and_drops_duplicates():
    assert parse_servers("a:1, b:2,a:1,") == ["a:1", "b:2"]
    for bad in ("", "a", "a:", ":1", "a:x", "a:0"):
        with pytest.raises(ValueError):
            parse_servers(bad)


# ---------------------------------------------------------- output shapes

def test_status_row_of_a_reachable_node_has_exactly_the_documented_keys():
    metadata = pb.MetadataResponse(self_id="n1", role="LEADER", term=3, leader_id="n1",
                                   ledger_begin_index=0, ledger_end_index=41, committed_index=40,
                                   pid=1234, metrics_address="127.0.0.1:21012")
    row = node_status_row("127.0.0.1:20912", metadata)
    assert list(row) == STATUS_KEYS
    assert row == {"id": "n1", "address": "127.0.0.1:20912", "pid": 1234, "role": "LEADER",
                   "term": 3, "leader_id": "n1", "ledger_begin_index": 0, "ledger_end_index": 41,
                   "committed_index": 40, "metrics_address": "127.0.0.1:21012", "repairing": False,
                   "repair_until": None, "no_intact_copy": None}


def test_status_row_of_an_unreachable_node_is_null_but_role_and_address():
    row = node_status_row("127.0.0.1:20913", None)
    assert list(row) == STATUS_KEYS
    assert row["role"] == "unreachable" and row["address"] == "127.0.0.1:20913"
    assert all(row[k] is None for k in STATUS_KEYS if k not in ("role", "address"))
    assert node_status_row("127.0.0.1:20913", None, "n2")["id"] == "n2"


def test_a_follower_without_leader_reports_null_leader_id():
    row = node_status_row("a:1", pb.MetadataResponse(self_id="n0", role="CANDIDATE", term=2))
    assert row["leader_id"] is None and row["metrics_address"] is None


def test_status_json_wraps_rows_in_nodes():
    rows = [node_status_row("a:1", None)]
    assert json.loads(cli.dumps(cli.status_json(rows))) == {"nodes": rows}
    assert "unreachable" in cli.status_table(rows)


def test_status_says_once_why_no_leader_can_be_elected_without_losing_entries():
    why = "no reachable voter holds entries up to 57 (term 3) intact: ..."
    rows = [node_status_row(f"a:{i}", pb.MetadataResponse(self_id=f"n{i}", role="CANDIDATE", term=4,
                                                           repairing=True, repair_until=57, no_intact_copy=why))
            for i in range(2)] + [node_status_row("a:2", None, "n2")]
    assert rows[0]["no_intact_copy"] == why and rows[2]["no_intact_copy"] is None
    lines = cli.status_table(rows).splitlines()
    assert lines[-2:] == [f"NO_INTACT_COPY n0: {why}", f"NO_INTACT_COPY n1: {why}"]


def test_entry_json_carries_the_body_in_base64():
    entry = pb.Entry(index=7, term=2, body=b"\x00hello")
    assert cli.entry_json(entry) == {"index": 7, "term": 2, "body_base64": "AGhlbGxv"}


def test_append_json_shape():
    assert cli.append_json(2000, 5, 2004) == {"appended": 2000, "first_index": 5, "last_index": 2004}


def test_generated_bodies_have_the_requested_size_and_differ():
    bodies = cli.make_bodies(998, 3, 6)
    assert bodies == [b"...998", b"...999", b"..1000"]
    assert all(len(b) == 100 for b in cli.make_bodies(0, 50, 100))
    assert cli.make_bodies(0, 2, 0) == [b"", b""]


def test_bench_result_json_has_exactly_the_documented_keys():
    result = BenchResult(size=1024, inflight=16, batch=4, duration_s=2.0, acked_entries=4000,
                         latencies_s=[0.001] * 98 + [0.002, 0.010])
    line = result.to_json()
    assert list(line) == ["size", "inflight", "batch", "duration_s", "acks_per_s", "mb_per_s",
                          "p50_ms", "p99_ms"]
    assert line["acks_per_s"] == 2000.0
    assert line["mb_per_s"] == round(2000 * 1024 / 1e6, 3)
    assert line["p50_ms"] == 1.0 and line["p99_ms"] == 2.0


def test_percentile_is_nearest_rank():
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0], 0.99) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


# ---------------------------------------------------------------- launcher

def test_launcher_plan_names_ports_and_directories(tmp_path):
    nodes = plan_nodes(3, str(tmp_path), 20911)
    assert [(n.id, n.port, n.metrics_port) for n in nodes] == [
        ("n0", 20911, 21011), ("n1", 20912, 21012), ("n2", 20913, 21013)]
    assert [Path(n.data_dir) for n in nodes] == [tmp_path / f"n{i}" for i in range(3)]
    assert peers_flag(nodes) == "n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913"


def test_launcher_starts_each_node_with_the_node_command(tmp_path):
    nodes = plan_nodes(3, str(tmp_path), 20911)
    command = node_command(nodes[1], nodes, "default")
    assert command[1:4] == ["-m", "cluster.cli", "node"]
    parser = cli.build_parser()
    config = config_from_args(parser.parse_args(command[3:]))
    assert config.self_id == "n1" and config.metrics_address == "127.0.0.1:21012"
    assert config.data_dir == nodes[1].data_dir


def test_cluster_up_refuses_a_data_dir_made_with_another_base_port(tmp_path, capsys):
    """A node keeps the configuration its data directory started with and
    ignores --peers: `cluster up` on that directory with another --base-port
    would never elect, so it says so and starts nothing."""
    first = plan_nodes(3, str(tmp_path), 20911)
    for node in first:
        config = build_config({"self_id": node.id, "peers": peers_flag(first), "data_dir": node.data_dir})
        os.makedirs(os.path.join(node.data_dir, f"dledger-{node.id}"))
        MembershipLog(config, os.path.join(node.data_dir, f"dledger-{node.id}")).load(lambda after: [])
    check_data_dirs(plan_nodes(3, str(tmp_path), 20911))   # the same ports: fine
    with pytest.raises(ValueError, match="n0 at 127.0.0.1:20911, not 127.0.0.1:30911"):
        check_data_dirs(plan_nodes(3, str(tmp_path), 30911))
    args = cli.build_parser().parse_args(["cluster", "up", "--data-dir", str(tmp_path), "--base-port", "30911"])
    assert args.run(args) == 2
    assert "--base-port" in capsys.readouterr().err


def test_launcher_plan_rejects_impossible_clusters():
    for count, port in ((0, 20911), (101, 20911), (3, 65436), (3, 0)):
        with pytest.raises(ValueError):
            plan_nodes(count, "d", port)


# ----------------------------------------------------------------- metrics

def sample_status(role: str = "LEADER") -> NodeStatus:
    return NodeStatus(group="g", self_id="n0", role=role, term=4, leader_id="n0",
                      leader_address="127.0.0.1:1", ledger_begin_index=0, ledger_end_index=99,
                      ledger_end_term=4, committed_index=98, flushed_index=99, pending_appends=3,
                      peers=[PeerStatus("n1", "127.0.0.1:2", 99, 0), PeerStatus("n2", "127.0.0.1:3", 90, 9)])


def test_metrics_read_the_status_at_scrape_time_and_count_events():
    metrics = NodeMetrics("g", "n0")
    current = {"status": sample_status()}
    metrics.bind(lambda: current["status"])
    metrics.observer.on_append(0.0004, 10)
    metrics.observer.on_election(4)
    node = {"group": "g", "self_id": "n0"}

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {**node, **labels})

    assert value("dledger_term") == 4
    assert value("dledger_ledger_begin_index") == 0
    assert value("dledger_ledger_end_index") == 99
    assert value("dledger_committed_index") == 98
    assert value("dledger_flushed_index") == 99
    assert value("dledger_pending_appends") == 3
    assert value("dledger_role", role="LEADER") == 1
    assert value("dledger_role", role="FOLLOWER") == 0
    assert value("dledger_peer_watermark", peer="n1") == 99
    assert value("dledger_peer_lag", peer="n2") == 9
    assert value("dledger_elections_total") == 1
    assert value("dledger_appended_entries_total") == 10
    assert value("dledger_append_latency_seconds_bucket", le="0.00025") == 0
    assert value("dledger_append_latency_seconds_bucket", le="0.0005") == 1
    assert value("dledger_append_latency_seconds_bucket", le="5.0") == 1
    current["status"] = sample_status("FOLLOWER")
    assert value("dledger_role", role="FOLLOWER") == 1
    assert value("dledger_role", role="LEADER") == 0


def test_two_nodes_in_one_process_keep_separate_registries():
    first, second = NodeMetrics("g", "n0"), NodeMetrics("g", "n1")
    first.observer.on_election(1)
    assert b"dledger_elections_total" in generate_latest(second.registry)
    assert b'self_id="n0"' not in generate_latest(second.registry)


async def test_a_scrape_from_the_http_thread_reads_the_status_on_the_event_loop():
    loop = asyncio.get_running_loop()
    seen_loops = []

    def status() -> NodeStatus:
        seen_loops.append(asyncio.get_running_loop())
        return sample_status()

    metrics = NodeMetrics("g", "n0")
    metrics.bind(status, loop)
    text = await asyncio.to_thread(generate_latest, metrics.registry)
    assert b"dledger_term{" in text
    assert seen_loops == [loop]


def test_a_failing_status_read_yields_no_gauges_instead_of_an_error():
    metrics = NodeMetrics("g", "n0")

    def broken() -> NodeStatus:
        raise RuntimeError("not started")

    metrics.bind(broken)
    assert b"dledger_term{" not in generate_latest(metrics.registry)


# -------------------------------------------- client against fake nodes

@dataclass
class FakeCluster:
    """Three fake nodes sharing one log; `leader` says who accepts appends."""
    leader: str = "n1"
    term: int = 2
    log: list[bytes] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)
    # Codes the leader answers to the next appends, in order.
    append_failures: list[int] = field(default_factory=list)
    append_calls: int = 0
    # Nodes that never answer Metadata (a paused process).
    frozen: set[str] = field(default_factory=set)
    # (producer id, sequence, body count) of every Append call the leader answered.
    append_requests: list[tuple[str, int, int]] = field(default_factory=list)


class FakeNode(dledger_pb2_grpc.DLedgerServiceServicer):
    def __init__(self, node_id: str, cluster: FakeCluster) -> None:
        self.id = node_id
        self.cluster = cluster

    def _not_leader(self) -> pb.Header | None:
        if self.id == self.cluster.leader:
            return None
        return pb.Header(code=ResponseCode.NOT_LEADER, message="not leader",
                         leader_id=self.cluster.leader,
                         leader_address=self.cluster.addresses[self.cluster.leader])

    async def Metadata(self, request, context):
        c = self.cluster
        if self.id in c.frozen:
            await asyncio.sleep(30)
        return pb.MetadataResponse(
            header=pb.Header(code=200), self_id=self.id, term=c.term,
            role="LEADER" if c.leader == self.id else "FOLLOWER", leader_id=c.leader,
            leader_address=c.addresses[c.leader], ledger_end_index=len(c.log) - 1,
            committed_index=len(c.log) - 1, pid=100 + int(self.id[1:]),
            peers=[pb.PeerState(id=i, address=a) for i, a in c.addresses.items()])

    async def Append(self, request, context):
        self.cluster.append_calls += 1
        header = self._not_leader()
        if header is not None:
            return pb.AppendResponse(header=header)
        self.cluster.append_requests.append((request.producer_id, request.sequence, len(request.bodies)))
        if self.cluster.append_failures:
            return pb.AppendResponse(header=pb.Header(code=self.cluster.append_failures.pop(0)))
        first = len(self.cluster.log)
        self.cluster.log.extend(request.bodies)
        return pb.AppendResponse(header=pb.Header(code=200), first_index=first,
                                 last_index=len(self.cluster.log) - 1)

    async def AppendStream(self, request_iterator, context):
        # The client's appends arrive here, one message at a time; each is
        # answered as the unary Append would be, with an outcome per caller.
        async for message in request_iterator:
            answer = await self.Append(message.append, context)
            response = pb.AppendStreamResponse(id=message.id, header=answer.header, first_index=answer.first_index,
                                               last_index=answer.last_index)
            if answer.header.code == 200:
                index = answer.first_index
                for count in list(message.counts) or [len(message.append.bodies)]:
                    response.outcomes.add(code=200, first_index=index, last_index=index + count - 1)
                    index += count
            yield response

    async def Get(self, request, context):
        if not 0 <= request.index < len(self.cluster.log):
            return pb.GetResponse(header=pb.Header(code=ResponseCode.INDEX_OUT_OF_RANGE,
                                                   message=f"index {request.index} out of range"))
        return pb.GetResponse(header=pb.Header(code=200), entry=pb.Entry(
            index=request.index, term=self.cluster.term, body=self.cluster.log[request.index]))

    async def Read(self, request, context):
        log = self.cluster.log
        start = 0 if request.start_index < 0 else request.start_index
        end = len(log) - 1 if request.end_index < 0 else request.end_index
        for batch_start in range(start, end + 1, 3):
            yield pb.ReadResponse(header=pb.Header(code=200), committed_index=len(log) - 1, entries=[
                pb.Entry(index=i, term=1, body=log[i]) for i in range(batch_start, min(end, batch_start + 2) + 1)])

    async def LeadershipTransfer(self, request, context):
        header = self._not_leader()
        if header is not None:
            return pb.LeadershipTransferResponse(header=header)
        self.cluster.leader = request.transferee_id
        self.cluster.term += 1
        return pb.LeadershipTransferResponse(header=pb.Header(code=200))


@pytest.fixture
async def fake_cluster():
    cluster = FakeCluster()
    servers = []
    for node_id in ("n0", "n1", "n2"):
        server = grpc.aio.server()
        dledger_pb2_grpc.add_DLedgerServiceServicer_to_server(FakeNode(node_id, cluster), server)
        port = server.add_insecure_port("127.0.0.1:0")
        cluster.addresses[node_id] = f"127.0.0.1:{port}"
        await server.start()
        servers.append(server)
    yield cluster
    await asyncio.gather(*(s.stop(None) for s in servers))


async def test_client_finds_the_leader_through_a_follower(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n0"]]) as client:
        result = await client.append([b"a", b"b"])
        assert (result.first_index, result.last_index) == (0, 1)
        assert await client.leader() == ("n1", fake_cluster.addresses["n1"])
        assert (await client.get(1)).body == b"b"


async def test_a_frozen_node_does_not_hold_up_finding_the_leader(fake_cluster):
    fake_cluster.frozen.add("n0")
    async with DLedgerClient(list(fake_cluster.addresses.values()), probe_timeout_s=5.0) as client:
        started = asyncio.get_running_loop().time()
        assert (await client.leader())[0] == "n1"
        assert asyncio.get_running_loop().time() - started < 1.0


async def test_client_follows_not_leader_after_the_leader_moved(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n0"]]) as client:
        await client.append_one(b"a")
        fake_cluster.leader = "n2"  # the cached leader n1 now answers NOT_LEADER
        calls = fake_cluster.append_calls
        result = await client.append_one(b"b")
        assert result.first_index == 1
        assert fake_cluster.append_calls == calls + 2
        assert (await client.leader())[0] == "n2"


async def test_append_retries_while_the_leader_is_transferring(fake_cluster):
    fake_cluster.append_failures = [ResponseCode.LEADER_TRANSFERRING, ResponseCode.LEADER_PENDING_FULL]
    async with DLedgerClient(list(fake_cluster.addresses.values())) as client:
        assert (await client.append_one(b"x")).first_index == 0
    assert fake_cluster.log == [b"x"]


@pytest.mark.parametrize("code", [ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED])
async def test_append_without_producer_id_is_not_retried_when_it_may_have_been_committed(fake_cluster, code):
    fake_cluster.append_failures = [code]
    async with DLedgerClient([fake_cluster.addresses["n1"]], producer_id="") as client:
        await client.leader()
        calls = fake_cluster.append_calls
        with pytest.raises(DLedgerError) as raised:
            await client.append_one(b"x")
    assert raised.value.code == code
    assert fake_cluster.append_calls == calls + 1


@pytest.mark.parametrize("code", [ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED])
async def test_idempotent_append_is_retried_with_the_same_sequence(fake_cluster, code):
    fake_cluster.append_failures = [code]
    async with DLedgerClient([fake_cluster.addresses["n1"]], producer_id="p1") as client:
        await client.append_one(b"x")
        await client.append_one(b"y")
    assert fake_cluster.append_requests == [("p1", 0, 1), ("p1", 0, 1), ("p1", 1, 1)]


async def test_concurrent_appends_share_rpcs_and_each_gets_its_own_indexes(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n1"]], producer_id="p1", max_inflight_appends=2) as client:
        await client.leader()
        results = await asyncio.gather(*(client.append([f"{i}a".encode(), f"{i}b".encode()]) for i in range(50)))
    for i, result in enumerate(results):
        bodies = fake_cluster.log[result.first_index:result.last_index + 1]
        assert bodies == [f"{i}a".encode(), f"{i}b".encode()]
    calls = fake_cluster.append_requests
    assert len(calls) < 50 and sum(count for _, _, count in calls) == 100
    # Every RPC its own sequence number (two in flight may arrive in either order).
    assert sorted(sequence for _, sequence, _ in calls) == list(range(len(calls)))


async def test_without_coalescing_every_append_is_its_own_rpc(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n1"]], coalesce=False) as client:
        await client.leader()
        await asyncio.gather(*(client.append_one(b"x") for _ in range(10)))
    assert len(fake_cluster.append_requests) == 10


async def test_errors_carry_the_server_code_and_message(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n1"]]) as client:
        with pytest.raises(DLedgerError) as raised:
            await client.get(5)
    assert raised.value.code == ResponseCode.INDEX_OUT_OF_RANGE
    assert "index 5 out of range" in str(raised.value)


async def test_read_streams_the_range_in_order_from_a_named_node(fake_cluster):
    fake_cluster.log = [bytes([i]) for i in range(10)]
    async with DLedgerClient([fake_cluster.addresses["n1"]]) as client:
        everything = [e.index async for e in client.read()]
        part = [e.body async for e in client.read(2, 5, from_id="n2")]
    assert everything == list(range(10))
    assert part == [bytes([i]) for i in range(2, 6)]


async def test_status_lists_every_peer_and_marks_dead_ones_unreachable(fake_cluster):
    fake_cluster.addresses["n3"] = "127.0.0.1:1"  # a member nobody serves
    async with DLedgerClient([fake_cluster.addresses["n0"]]) as client:
        rows = await client.cluster_status()
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {"n0", "n1", "n2", "n3"}
    assert by_id["n1"]["role"] == "LEADER" and by_id["n0"]["leader_id"] == "n1"
    assert by_id["n3"]["role"] == "unreachable" and by_id["n3"]["term"] is None


async def test_leadership_transfer_returns_once_the_new_leader_reports(fake_cluster):
    async with DLedgerClient([fake_cluster.addresses["n0"]]) as client:
        assert await client.leadership_transfer("n2") == ("n2", 3)
        # Asking for the current leader is already done.
        assert await client.leadership_transfer("n2") == ("n2", 3)


async def test_unreachable_servers_fail_after_the_deadline():
    async with DLedgerClient(["127.0.0.1:1"], deadline_s=0.3) as client:
        with pytest.raises(DLedgerError) as raised:
            await client.append_one(b"x")
    assert raised.value.code == ResponseCode.NETWORK_ERROR
