"""Live mode against a secured node (TLS, mutual TLS between peers,
authentication and ACLs): with the user, secretFile and tlsCa options the
read returns the committed entries; without credentials it fails at once
with a message that says which options to give; a user without Sub on the
Cluster is refused the same way. One single-node secured cluster, read by
both readers: the JVM reader (its own gRPC client on Spark's Netty: TLS
checked against the CA, calls signed) and the Python one."""
from __future__ import annotations

import asyncio
import http.client
import time
from pathlib import Path

import pytest

from cluster import certs
from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from dledger.rpc.credentials import ClientSecurity
from rpcgen.pydledger.auth.v1 import auth_pb2 as authpb
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc
from tests.spark.helpers import run

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(240)]

ADMIN_SECRET = "admin-secret-0123"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("spark-secure")
    (base / "admin.secret").write_text(ADMIN_SECRET + "\n")
    (base / "reader.secret").write_text("reader-secret-1\n")
    (base / "nobody.secret").write_text("nobody-secret-1\n")
    pki = base / "pki"
    certs.create(pki, ["n0"])
    cluster = ProcessCluster(base / "nodes", 1, tls_dir=pki, metrics=True, extra_args=[
        "--auth-enabled", "true", "--auth-super-secret-file", str(base / "admin.secret")])
    cluster.start()
    try:
        admin = ClientSecurity("admin", ADMIN_SECRET, (pki / "ca.pem").read_bytes())
        run(_prepare(cluster, admin))
        yield cluster, base
    finally:
        cluster.stop_all()


async def _prepare(cluster: ProcessCluster, admin: ClientSecurity) -> None:
    address = cluster.addresses["n0"]
    deadline = time.monotonic() + 30
    async with DLedgerClient([address], security=admin) as client:
        while True:
            try:
                await client.append([b"secured-%d" % i for i in range(40)])
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    async with admin.channel(address) as channel:
        stub = auth_pb2_grpc.AuthServiceStub(channel)
        for name in ("reader", "nobody"):
            await stub.CreateUser(authpb.UserRequest(name=name, secret=f"{name}-secret-1"), timeout=5)
        await stub.CreateAcl(authpb.CreateAclRequest(subject="User:reader", entries=[
            authpb.AclEntry(resource="Cluster", actions=["Sub"])]), timeout=5)


@pytest.fixture(params=["jvm", "python"])
def reader(request, spark_session) -> str:
    from spark.jvm_reader import on_classpath

    if request.param == "jvm" and not on_classpath(spark_session):
        pytest.skip("the JVM reader is not on the session's classpath (no javac? spark.jvm_reader logs why)")
    return request.param


def _live(spark_session, cluster: ProcessCluster, base: Path, reader: str, **security: str):
    reader = spark_session.read.format("dledger").option("servers", cluster.addresses["n0"]).option("reader", reader)
    for name, value in security.items():
        reader = reader.option(name, value)
    return reader.load()


def test_a_live_read_with_credentials_and_the_ca_returns_the_committed_entries(spark_session, secured,
                                                                                reader) -> None:
    cluster, base = secured
    df = _live(spark_session, cluster, base, reader, user="reader", secretFile=str(base / "reader.secret"),
               tlsCa=str(base / "pki" / "ca.pem"))
    rows = df.select("kind", "body").collect()
    assert sorted(bytes(r.body) for r in rows if r.kind == "raw") == sorted(b"secured-%d" % i for i in range(40))
    # Users' creations and metadata snapshots hold secrets: a reader who is
    # not a super user never gets them (the topics' and groups' system entries it does).
    assert not any(b"secret" in bytes(r.body) for r in rows)


def test_the_secured_node_sends_no_runs_over_plain_http(secured) -> None:
    """Its metrics port has neither TLS nor signatures: raw reads there are
    refused (readers use the gRPC Read, TLS and signed, as above)."""
    cluster, _ = secured
    conn = http.client.HTTPConnection("127.0.0.1", cluster.metrics_ports["n0"], timeout=10)
    conn.request("GET", "/dledger/runs?start=0&end=3")
    answer = conn.getresponse()
    assert answer.status == 403 and "off on a node with TLS or authentication" in answer.read().decode()


@pytest.mark.parametrize("user, code", [(None, "UNAUTHENTICATED"), ("nobody", "FORBIDDEN")])
def test_a_live_read_without_credentials_or_rights_fails_with_a_clear_message(spark_session, secured, user,
                                                                              code, reader) -> None:
    cluster, base = secured
    options = {"tlsCa": str(base / "pki" / "ca.pem")}
    if user:
        options.update(user=user, secretFile=str(base / f"{user}.secret"))
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        _live(spark_session, cluster, base, reader, **options).count()
    message = str(failure.value)
    assert code in message and "set the options user and secretFile" in message, message[-2000:]
    assert time.monotonic() - started < 25   # refused at once, not after the planning timeout


def test_a_missing_secret_file_is_an_option_error(spark_session, secured, reader) -> None:
    cluster, base = secured
    with pytest.raises(Exception) as failure:
        _live(spark_session, cluster, base, reader, user="reader", secretFile=str(base / "absent.secret"),
              tlsCa=str(base / "pki" / "ca.pem")).count()
    assert "cannot be read" in str(failure.value)
