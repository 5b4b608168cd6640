"""The official RocketMQ 5 Python client against a cluster with TLS, mutual
TLS between peers, request signatures and ACLs on: it trusts the test CA
(GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, as its docs leave it) and signs with its
credentials, unchanged. A user allowed Pub on one topic sends there and is
refused (FORBIDDEN) on another; a consumer with Sub on its group and topic
receives; a wrong secret, an unknown user and a stale date-time are refused
with UNAUTHORIZED, and a plaintext client cannot reach the TLS port."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from broker.client.admin import AdminClient
from cluster import certs
from cluster.process_cluster import ROOT, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.entry import INDEX_RECORD, INDEX_RECORD_SIZE
from dledger.rpc.credentials import ClientSecurity, authorization_value
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ADMIN_SECRET = "admin-secret-0123"
USERS = {"alice": "alice-secret-1", "bob": "bob-secret-22", "nora": "nora-secret-333"}


def dledger(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("secure")
    pki = base / "pki"
    (base / "admin.secret").write_text(ADMIN_SECRET + "\n")
    for name, secret in USERS.items():
        (base / f"{name}.secret").write_text(secret + "\n")
    cluster = ProcessCluster(base / "nodes", tls_dir=pki, extra_args=[
        "--auth-enabled", "true", "--auth-super-secret-file", str(base / "admin.secret")])
    certs.create(pki, cluster.ids, endpoints=list(cluster.addresses.values()))
    cluster.start()
    try:
        asyncio.run(_prepare(cluster, base))
        yield cluster, base
    finally:
        cluster.stop_all()


async def _prepare(cluster: ProcessCluster, base: Path) -> None:
    addresses = list(cluster.addresses.values())
    admin = ClientSecurity(user="admin", secret=ADMIN_SECRET, ca=(base / "pki" / "ca.pem").read_bytes())
    async with DLedgerClient(addresses, security=admin) as client:
        await find_leader(client, addresses, timeout=30)
    async with AdminClient(addresses, security=admin) as client:
        for topic in ("Allowed", "Refused", "Hidden"):
            await client.create_topic(topic)
        await client.create_group("readers")
    # Users and ACLs through the CLI, as an operator makes them.
    env = {"DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": str(base / "admin.secret"),
           "DLEDGER_TLS_CA": str(base / "pki" / "ca.pem")}
    servers = ",".join(addresses)
    for name in USERS:
        dledger("user", "create", "--servers", servers, "--name", name, "--new-secret-file",
                str(base / f"{name}.secret"), env=env)
    dledger("acl", "create", "--servers", servers, "--subject", "User:alice", "--resource", "Topic:Allowed",
            "--actions", "Pub", env=env)
    dledger("acl", "create", "--servers", servers, "--subject", "User:alice", "--resource", "Topic:Refused",
            "--actions", "Sub", env=env)
    dledger("acl", "create", "--servers", servers, "--subject", "User:bob", "--resource", "Topic:Allowed",
            "--resource", "Group:readers", "--actions", "Sub", env=env)
    dledger("acl", "create", "--servers", servers, "--subject", "User:nora", "--resource", "Namespace:tenant1",
            "--actions", "Pub", env=env)
    listed = json.loads(dledger("acl", "list", "--servers", servers, "--json", env=env))
    assert {a["subject"] for a in listed["acls"]} == {"User:alice", "User:bob", "User:nora"}
    await asyncio.sleep(0.5)  # every node has applied the ACLs


SCRIPT = textwrap.dedent("""
    import json, sys, time
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    endpoints, user, secret, tls, action = sys.argv[1:6]
    if action.startswith("stale"):
        # The client signs its own clock: an hour-old clock is a replay.
        import datetime as real
        import rocketmq.v5.util.signature as signature
        class OldClock(real.datetime):
            @classmethod
            def now(cls, tz=None):
                return real.datetime.now(tz) - real.timedelta(hours=1)
        signature.datetime = OldClock
    namespace = sys.argv[7] if len(sys.argv) > 7 else ""
    config = ClientConfiguration(endpoints, Credentials(user, secret), namespace=namespace, request_timeout=5)
    # A refused QueryRoute reaches the application only as "failed to fetch
    # route"; the client logs the server's code and message: keep them.
    import logging, re
    logged = []
    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())
    logging.getLogger("rocketmq-python-client").addHandler(Keep())
    def outcome(error):
        code, message = getattr(error, "code", None), str(error)
        if not isinstance(code, int):
            code = None
            for line in logged:
                found = re.search(r"(40[0-9]{3}), (.*)", line)
                if found:
                    code, message = int(found.group(1)), found.group(2)
                    break
        return {"error": type(error).__name__, "code": code, "message": message[:300]}
    def send(topic):
        producer = Producer(config, (topic,), tls_enable=tls == "tls")
        producer.startup()
        try:
            m = Message(); m.topic = topic; m.body = b"secured"; m.tag = "T"
            return {"message_id": producer.send(m).message_id}
        except Exception as error:
            return outcome(error)
        finally:
            producer.shutdown()
    if action in ("send", "stale-send"):
        print(json.dumps(send(sys.argv[6])))
    elif action == "receive":
        consumer = SimpleConsumer(config, "readers", {"Allowed": FilterExpression("*")}, tls_enable=True)
        consumer.startup()
        got = []
        deadline = time.time() + 40
        try:
            while time.time() < deadline and not got:
                for message in consumer.receive(16, 15):
                    got.append(message.body.decode())
                    consumer.ack(message)
        except Exception as error:
            print(json.dumps(outcome(error))); sys.exit(0)
        finally:
            consumer.shutdown()
        print(json.dumps({"received": got}))
""")


def official(cluster: ProcessCluster, base: Path, user: str, secret: str, action: str, *rest: str,
             tls: bool = True) -> dict:
    env = dict(os.environ, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(base / "pki" / "ca.pem"))
    done = subprocess.run([sys.executable, "-c", SCRIPT, ";".join(cluster.addresses.values()), user, secret,
                           "tls" if tls else "plain", action, *rest],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_user_sends_where_allowed_and_is_forbidden_elsewhere(secure) -> None:
    cluster, base = secure
    assert "message_id" in official(cluster, base, "alice", USERS["alice"], "send", "Allowed")
    # Sub only on Refused: the route is hers to see, the send is not.
    refused = official(cluster, base, "alice", USERS["alice"], "send", "Refused")
    assert refused["code"] == pb.FORBIDDEN, refused
    assert "alice" in refused["message"] and "Pub on Topic:Refused" in refused["message"]
    # Nothing on Hidden: already the route is refused.
    hidden = official(cluster, base, "alice", USERS["alice"], "send", "Hidden")
    assert hidden["code"] == pb.FORBIDDEN and "Topic:Hidden" in hidden["message"], hidden


def test_a_consumer_with_sub_on_its_group_and_topic_receives(secure) -> None:
    cluster, base = secure
    assert "message_id" in official(cluster, base, "alice", USERS["alice"], "send", "Allowed")
    got = official(cluster, base, "bob", USERS["bob"], "receive")
    assert got.get("received") and set(got["received"]) == {"secured"}, got


def test_the_official_client_in_a_namespace_is_held_to_its_namespace(secure) -> None:
    cluster, base = secure
    assert "message_id" in official(cluster, base, "nora", USERS["nora"], "send", "Invoices", "tenant1")
    refused = official(cluster, base, "nora", USERS["nora"], "send", "Invoices", "tenant2")
    assert refused["code"] == pb.FORBIDDEN and "tenant2%Invoices" in refused["message"], refused


@pytest.mark.parametrize("user, secret, action, reason", [
    ("alice", "not-her-secret", "send", "does not match"),
    ("mallory", "whatever-secret", "send", "is not known"),
    ("alice", USERS["alice"], "stale-send", "from this node's clock"),
])
def test_bad_credentials_are_unauthorized(secure, user: str, secret: str, action: str, reason: str) -> None:
    cluster, base = secure
    refused = official(cluster, base, user, secret, action, "Allowed")
    assert refused["code"] == pb.UNAUTHORIZED, refused
    assert reason in refused["message"], refused


def test_a_plaintext_client_cannot_use_the_tls_port(secure) -> None:
    cluster, base = secure
    refused = official(cluster, base, "alice", USERS["alice"], "send", "Allowed", tls=False)
    assert "message_id" not in refused and refused.get("error"), refused


async def test_unsigned_or_stale_raw_calls_are_refused(secure) -> None:
    """The same checks without the official client: no header, and a valid
    signature of an hour-old date-time."""
    cluster, base = secure
    security = ClientSecurity(ca=(base / "pki" / "ca.pem").read_bytes())
    request = spb.QueryRouteRequest(topic=pb.Resource(name="Allowed"), endpoints=pb.Endpoints(
        scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))
    old = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 3600))
    async with security.channel(cluster.addresses["n0"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        unsigned = await stub.QueryRoute(request, metadata=[("x-mq-client-id", "raw")], timeout=10)
        assert unsigned.status.code == pb.UNAUTHORIZED
        stale = await stub.QueryRoute(request, metadata=[
            ("x-mq-client-id", "raw"), ("x-mq-date-time", old),
            ("authorization", authorization_value("alice", USERS["alice"], old))], timeout=10)
        assert stale.status.code == pb.UNAUTHORIZED and "clock" in stale.status.message
    # Telemetry: a producer's settings naming a topic it may not publish to
    # end the stream with FORBIDDEN.
    alice = ClientSecurity(user="alice", secret=USERS["alice"], ca=security.ca)
    async with alice.channel(cluster.addresses["n1"]) as channel:
        call = service_pb2_grpc.MessagingServiceStub(channel).Telemetry(
            metadata=[("x-mq-client-id", "raw-telemetry")], timeout=10)
        await call.write(spb.TelemetryCommand(settings=pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Hidden")]))))
        answer = await asyncio.wait_for(call.read(), 5)
        assert answer.status.code == pb.FORBIDDEN and "Pub on Topic:Hidden" in answer.status.message, answer
        call.cancel()
    # The log API: no credentials, no append.
    async with DLedgerClient(list(cluster.addresses.values()), security=security, deadline_s=2) as client:
        with pytest.raises(Exception, match="UNAUTHENTICATED"):
            await client.append([b"intruder"])


async def test_log_readers_who_are_not_super_users_never_see_users_secrets(secure) -> None:
    """Users travel through the log; the log API's Read and Get serve raw
    entries to any user with Sub on the Cluster, so they must keep the
    entries that hold secrets from all but super users."""
    from broker.auth.log_secrets import holds_secrets
    cluster, base = secure
    env = {"DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": str(base / "admin.secret"),
           "DLEDGER_TLS_CA": str(base / "pki" / "ca.pem")}
    servers = ",".join(cluster.addresses.values())
    (base / "reader.secret").write_text("reader-secret-9\n")
    dledger("user", "create", "--servers", servers, "--name", "reader", "--new-secret-file",
            str(base / "reader.secret"), env=env)
    dledger("acl", "create", "--servers", servers, "--subject", "User:reader", "--resource", "Cluster",
            "--actions", "Sub", env=env)
    ca = (base / "pki" / "ca.pem").read_bytes()
    addresses = list(cluster.addresses.values())
    async with DLedgerClient(addresses, security=ClientSecurity("admin", ADMIN_SECRET, ca)) as admin:
        everything = [e async for e in admin.read()]
    hidden = [e for e in everything if holds_secrets(e)]
    assert hidden and any(USERS["alice"].encode() in e.body for e in hidden)
    await asyncio.sleep(0.5)   # every node has applied the ACL
    async with DLedgerClient(addresses, security=ClientSecurity("reader", "reader-secret-9", ca)) as reader:
        seen = [e async for e in reader.read(end=everything[-1].index)]
        assert {e.index for e in seen} == {e.index for e in everything} - {e.index for e in hidden}
        assert not any(b"secret" in e.body for e in seen)
        with pytest.raises(Exception, match="holds users' secrets"):
            await reader.get(hidden[0].index)
        # The raw read (Spark's live source) is answered in pieces around them.
        runs = [run async for run in reader.read_raw(0, everything[-1].index)]
    raw_indexes = {INDEX_RECORD.unpack_from(records, k)[3] for records, _ in runs
                   for k in range(0, len(records), INDEX_RECORD_SIZE)}
    assert raw_indexes.isdisjoint(e.index for e in hidden) and {e.index for e in seen} <= raw_indexes
    assert not any(b"secret" in data for _, data in runs)
    for records, data in runs:   # each piece still a run of back-to-back entries
        first = INDEX_RECORD.unpack_from(records, 0)
        last = INDEX_RECORD.unpack_from(records, len(records) - INDEX_RECORD_SIZE)
        assert len(data) == last[1] + last[2] - first[1]


def test_the_console_reads_a_secured_cluster_with_the_operators_credentials(secure, monkeypatch) -> None:
    from cluster.console.backend import ConsoleBackend, Target
    cluster, base = secure
    monkeypatch.setenv("DLEDGER_USER", "admin")
    monkeypatch.setenv("DLEDGER_SECRET_FILE", str(base / "admin.secret"))
    monkeypatch.setenv("DLEDGER_TLS_CA", str(base / "pki" / "ca.pem"))
    backend = ConsoleBackend(Target(tuple(cluster.addresses.values())))
    try:
        roles = {row["role"] for row in backend.cluster()["nodes"]}
        assert "LEADER" in roles and "unreachable" not in roles
        assert "Allowed" in {t["topic"] for t in backend.topics()["topics"]}
    finally:
        backend.close()
