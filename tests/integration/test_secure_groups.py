"""`dledger cluster up --secure --groups 2`: two broker groups behind a
secured name server (TLS for clients, mutual TLS for the groups'
registrations, signed calls). Only members of the cluster register a group;
a route query is answered over TLS, signed, and only with what the groups'
own ACLs let the caller see; topics and messages still span both groups.

One launcher (two single-node groups and a name server) serves every check."""
from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from broker.client import Message, Producer
from broker.client.config import ClientConfig
from cluster import certs
from cluster.process_cluster import ROOT, free_base_port
from dledger.rpc import tls
from dledger.rpc.credentials import ClientSecurity, read_secret
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ALICE_SECRET = "alice-secret-42"


def free_secure_group_base_port() -> int:
    """Two secured groups of three and the name server (clients, metrics, members' ports)."""
    return free_base_port([*(offset + 10 * g + i for offset in (0, 100, 200) for g in (0, 1) for i in range(3)),
                           90, 190, 290])


class SecureGroups:
    def __init__(self, base: int, data: Path) -> None:
        self.base = base
        self.data = data
        self.secure = data / "secure"
        self.env = {"DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": str(self.secure / "admin.secret"),
                    "DLEDGER_TLS_CA": str(self.secure / "ca.pem")}

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.base + 90}"

    @property
    def namesrv_members(self) -> str:
        return f"127.0.0.1:{self.base + 290}"

    def node(self, group: int) -> str:
        return f"127.0.0.1:{self.base + 10 * group}"

    def admin(self) -> ClientSecurity:
        return ClientSecurity("admin", read_secret(str(self.secure / "admin.secret")),
                              (self.secure / "ca.pem").read_bytes())

    def dledger(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env={**os.environ, **self.env})
        assert not check or done.returncode == 0, done.stderr
        return done


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory):
    base = free_secure_group_base_port()
    tmp = tmp_path_factory.mktemp("secure-groups")
    log = open(tmp / "nodes.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "cluster.cli", "cluster", "up", "--secure", "--groups", "2",
                                "--nodes", "1", "--data-dir", str(tmp / "data"), "--base-port", str(base)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        seen = []
        while not any(line.startswith("ready") for line in seen):
            assert time.monotonic() < deadline, "".join(seen) + (tmp / "nodes.log").read_text()[-3000:]
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert process.poll() is None, (tmp / "nodes.log").read_text()[-3000:]
        assert any(line.startswith(f"namesrv grpc=127.0.0.1:{base + 90} members=127.0.0.1:{base + 290}")
                   for line in seen), seen
        yield SecureGroups(base, tmp / "data")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def registration(group: str = "g9") -> npb.RegisterBrokerRequest:
    return npb.RegisterBrokerRequest(cluster_name="DefaultCluster", broker_name=group, node_id=f"{group}n0", term=1,
                                     nodes=[npb.BrokerNode(id=f"{group}n0", address="127.0.0.1:1", broker_id=0,
                                                           role="LEADER")])


async def _register(channel: grpc.aio.Channel, signed_by: ClientSecurity | None = None) -> npb.RegisterBrokerResponse:
    signer = signed_by.signer() if signed_by is not None else None
    return await namesrv_pb2_grpc.NameServerStub(channel).RegisterBroker(
        registration(), metadata=signer.headers() if signer else None, timeout=5)


async def _route(groups: SecureGroups, topic: str, security: ClientSecurity) -> npb.RouteByTopicResponse:
    async with security.channel(groups.namesrv) as channel:
        return await namesrv_pb2_grpc.NameServerStub(channel).RouteByTopic(npb.RouteByTopicRequest(topic=topic),
                                                                          timeout=5)


def test_topics_and_messages_span_both_secured_groups(groups: SecureGroups) -> None:
    status = json.loads(groups.dledger("status", "--servers", groups.node(0), "--json").stdout)
    assert sorted((n["group"], n["role"]) for n in status["nodes"]) == [("g0", "LEADER"), ("g1", "LEADER")]
    created = json.loads(groups.dledger("topic", "create", "--servers", groups.node(0), "--topic", "Orders",
                                        "--queues", "2", "--json").stdout)
    assert [g["group"] for g in created["groups"]] == ["g0", "g1"]

    async def send() -> set[str]:
        async with Producer(ClientConfig((groups.node(0),), security=groups.admin())) as producer:
            receipts = await producer.send_batch([Message("Orders", b"%d" % i) for i in range(64)])
        return {r.broker_name for r in receipts}
    assert asyncio.run(send()) == {"g0", "g1"}


async def test_only_members_register_a_group(groups: SecureGroups) -> None:
    admin = groups.admin()
    # The members' port: a process without a certificate of the cluster CA
    # cannot complete the handshake, with or without the admin's signature.
    async with tls.channel(groups.namesrv_members, ca=admin.ca) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(channel, signed_by=admin)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    foreign = groups.data.parent / "foreign"
    certs.create(foreign, ["g9n0"])
    material = tls.TlsMaterial((foreign / "g9n0.pem").read_bytes(), (foreign / "g9n0-key.pem").read_bytes(),
                               admin.ca)
    async with tls.channel(groups.namesrv_members, material=material) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # The clients' port refuses registrations, signed by the admin or not, with a code that says why.
    async with admin.channel(groups.namesrv, sign=False) as channel:
        answer = await _register(channel, signed_by=admin)
    assert answer.status.code == pb.FORBIDDEN and "mutual-TLS port (--peer-listen)" in answer.status.message
    # Plaintext to the TLS port: no handshake.
    async with grpc.aio.insecure_channel(groups.namesrv) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # A member registers: a certificate of the cluster CA on the members' port.
    node = tls.load_material(str(groups.secure / "g0n0.pem"), str(groups.secure / "g0n0-key.pem"),
                             str(groups.secure / "ca.pem"))
    async with tls.channel(groups.namesrv_members, material=node) as channel:
        info = await namesrv_pb2_grpc.NameServerStub(channel).ClusterInfo(npb.ClusterInfoRequest(), timeout=5)
    assert [g.broker_name for g in info.groups] == ["g0", "g1"]


async def test_route_queries_are_signed_and_answered_as_each_group_would(groups: SecureGroups) -> None:
    admin = groups.admin()
    alice_file = groups.data.parent / "alice.secret"
    alice_file.write_text(ALICE_SECRET + "\n")
    for group in (0, 1):   # groups share nothing: each has its own users
        groups.dledger("topic", "create", "--servers", groups.node(group), "--topic", "Ledger", "--queues", "1",
                       "--groups", f"g{group}")
        groups.dledger("user", "create", "--servers", groups.node(group), "--name", "alice",
                       "--new-secret-file", str(alice_file))
    groups.dledger("acl", "create", "--servers", groups.node(0), "--subject", "User:alice",
                   "--resource", "Topic:Ledger", "--actions", "Sub")
    alice = ClientSecurity("alice", ALICE_SECRET, admin.ca)

    unsigned = await _route(groups, "Ledger", ClientSecurity(ca=admin.ca))
    assert unsigned.status.code == pb.UNAUTHORIZED and "requires credentials" in unsigned.status.message
    every = await _route(groups, "Ledger", admin)
    assert every.status.code == pb.OK and sorted(r.group.broker_name for r in every.routes) == ["g0", "g1"]
    # Alice may Sub on Ledger in g0 only: she sees g0's route, once g0's
    # leader has registered her (at once after the change).
    deadline = time.monotonic() + 10
    while True:
        answer = await _route(groups, "Ledger", alice)
        if answer.status.code == pb.OK or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert answer.status.code == pb.OK, answer.status
    assert [r.group.broker_name for r in answer.routes] == ["g0"]
    forbidden = await _route(groups, "Orders", alice)
    assert forbidden.status.code == pb.FORBIDDEN and "'alice' may not Pub or Sub on Topic:Orders" in \
        forbidden.status.message
    wrong = await _route(groups, "Ledger", ClientSecurity("alice", "not-her-secret", admin.ca))
    assert wrong.status.code == pb.UNAUTHORIZED and "does not match" in wrong.status.message
    unknown = await _route(groups, "Ledger", ClientSecurity("mallory", "whatever-1", admin.ca))
    assert unknown.status.code == pb.UNAUTHORIZED and "not known" in unknown.status.message
    async with alice.channel(groups.namesrv) as channel:
        info = await namesrv_pb2_grpc.NameServerStub(channel).ClusterInfo(npb.ClusterInfoRequest(), timeout=5)
    assert info.status.code == pb.FORBIDDEN and "List on Cluster" in info.status.message
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{groups.base + 190}/metrics", timeout=5).read().decode()
    assert 'dledger_namesrv_auth_denied_total{reason="missing",rpc="RouteByTopic"}' in metrics
    assert 'dledger_namesrv_auth_denied_total{reason="forbidden",rpc="RegisterBroker"}' in metrics


def test_our_client_looks_routes_up_at_the_secured_name_server(groups: SecureGroups) -> None:
    async def send() -> set[str]:
        config = ClientConfig((groups.node(1),), namesrv_addrs=(groups.namesrv,), security=groups.admin())
        async with Producer(config) as producer:
            receipts = await producer.send_batch([Message("Orders", b"via the name server %d" % i)
                                                  for i in range(64)])
        return {r.broker_name for r in receipts}
    assert asyncio.run(send()) == {"g0", "g1"}
