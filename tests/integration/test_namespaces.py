"""Namespaces: the same topic name in two namespaces is two topics (stored
as `<ns>%<name>`), a consumer sees only its namespace's messages under the
plain name, and ACLs can be granted per namespace."""
from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from broker.client import Message, Producer, SimpleConsumer
from broker.client.admin import AdminClient
from broker.client.errors import ClientError
from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.rpc.credentials import ClientSecurity
from rpcgen import dledger_pb2, dledger_pb2_grpc
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ADMIN = ClientSecurity(user="admin", secret="admin-secret-0123")


def as_user(user: str, namespace: str) -> ClientSecurity:
    return ClientSecurity(user=user, secret=f"{user}-secret-1", namespace=namespace)


async def known_everywhere(servers: list[str], user: ClientSecurity, timeout: float = 15.0) -> None:
    """Every node knows `user`: users are replicated state, and a follower
    that has not applied the entry yet refuses the user (a fixed 0.5 s wait
    was once too short under the full suite's load)."""
    deadline = asyncio.get_running_loop().time() + timeout
    for address in servers:
        async with user.channel(address) as channel:
            stub = dledger_pb2_grpc.DLedgerServiceStub(channel)
            while True:
                try:
                    await stub.Metadata(dledger_pb2.MetadataRequest(header=dledger_pb2.Header()), timeout=2)
                    break
                except grpc.aio.AioRpcError as error:
                    # Refused until the node has applied the user; unavailable
                    # while a node started with the others does not listen yet.
                    if error.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE) or \
                            asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.1)


async def receive_all(servers: list[str], group: str, topic: str, namespace: str, security: ClientSecurity,
                      want: int) -> list[bytes]:
    got: list[bytes] = []
    async with SimpleConsumer(servers, group, {topic: "*"}, namespace=namespace, security=security) as consumer:
        for _ in range(20):
            for message in await consumer.receive(32, 30, await_duration_s=1):
                assert message.topic == topic  # the plain name, as the client named it
                got.append(message.body)
                await consumer.ack(message)
            if len(got) >= want:
                break
    return got


async def test_namespaces_separate_topics_and_take_acls(tmp_path: Path) -> None:
    (tmp_path / "admin.secret").write_text(ADMIN.secret)
    cluster = ProcessCluster(tmp_path / "nodes", extra_args=[
        "--auth-enabled", "true", "--auth-super-secret-file", str(tmp_path / "admin.secret")])
    cluster.start()
    try:
        servers = list(cluster.addresses.values())
        async with DLedgerClient(servers, security=ADMIN) as client:
            leader = await find_leader(client, servers, timeout=30)
        # The leader's port, which has answered: on a loaded machine another
        # node may not listen yet when two of three have elected.
        async with ADMIN.channel(cluster.addresses[leader]) as channel:
            stub = auth_pb2_grpc.AuthServiceStub(channel)
            for user, namespace in (("nina", "ns1"), ("otto", "ns2")):
                await stub.CreateUser(apb.UserRequest(name=user, secret=f"{user}-secret-1"), timeout=10)
                await stub.CreateAcl(apb.CreateAclRequest(subject=f"User:{user}", entries=[
                    apb.AclEntry(resource=f"Namespace:{namespace}", actions=["Pub", "Sub"])]), timeout=10)
        for user, namespace in (("nina", "ns1"), ("otto", "ns2")):
            await known_everywhere(servers, as_user(user, namespace))
        for user, namespace in (("nina", "ns1"), ("otto", "ns2")):
            async with Producer(servers, ["orders"], namespace=namespace, security=as_user(user, namespace)) as p:
                for i in range(3):
                    await p.send(Message("orders", f"{namespace}-{i}".encode()))
        # Each namespace reads only its own "orders".
        nina = await receive_all(servers, "g", "orders", "ns1", as_user("nina", "ns1"), 3)
        otto = await receive_all(servers, "g", "orders", "ns2", as_user("otto", "ns2"), 3)
        assert sorted(nina) == [b"ns1-0", b"ns1-1", b"ns1-2"]
        assert sorted(otto) == [b"ns2-0", b"ns2-1", b"ns2-2"]
        # Stored under the wrapped names; no plain "orders" exists.
        async with AdminClient(servers, security=ADMIN) as admin:
            names = {t.topic for t in await admin.list_topics()}
        assert {"ns1%orders", "ns2%orders"} <= names and "orders" not in names
        # A namespace's grant does not reach another namespace.
        with pytest.raises(ClientError) as refused:
            async with Producer(servers, ["orders"], namespace="ns2", security=as_user("nina", "ns2")) as p:
                await p.send(Message("orders", b"trespass"))
        assert refused.value.code == pb.FORBIDDEN and "ns2%orders" in refused.value.message
    finally:
        cluster.stop_all()
