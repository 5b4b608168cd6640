"""A cluster of node processes with auth on, and the super user's calls to
its AuthService, for the tests of authentication and ACLs."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cluster.process_cluster import ProcessCluster
from dledger.rpc.credentials import ClientSecurity
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc

ADMIN = ClientSecurity(user="admin", secret="admin-secret-0123")


def auth_cluster(tmp_path: Path, **options: object) -> ProcessCluster:
    """Three nodes with auth on and ADMIN as the bootstrap super user (not
    started)."""
    (tmp_path / "admin.secret").write_text(ADMIN.secret)
    return ProcessCluster(tmp_path / "nodes", extra_args=[
        "--auth-enabled", "true", "--auth-super-secret-file", str(tmp_path / "admin.secret")],
        **options)  # type: ignore[arg-type]


async def auth_call(address: str, method: str, request: object) -> object:
    async with ADMIN.channel(address) as channel:
        return await getattr(auth_pb2_grpc.AuthServiceStub(channel), method)(request, timeout=10)


def route_request(topic: str) -> spb.QueryRouteRequest:
    return spb.QueryRouteRequest(topic=pb.Resource(name=topic), endpoints=pb.Endpoints(
        scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))


async def route_code(address: str, security: ClientSecurity, topic: str = "Ledger") -> int:
    """The status code of `security`'s QueryRoute for `topic` on one node."""
    async with security.channel(address) as channel:
        response = await service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            route_request(topic), metadata=[("x-mq-client-id", "replication-test")], timeout=5)
    return response.status.code


async def wait_all(cluster: ProcessCluster, security: ClientSecurity, code: int, within: float,
                   topic: str = "Ledger") -> float:
    """Seconds until every node answers QueryRoute with `code` (users and
    ACLs reach each node as it applies the log: a follower may not know a
    new user yet when the leader already does)."""
    start = time.monotonic()
    pending = set(cluster.addresses)
    while pending:
        for node in list(pending):
            if await route_code(cluster.addresses[node], security, topic) == code:
                pending.discard(node)
        if time.monotonic() - start > within:
            raise AssertionError(f"{sorted(pending)} still do not answer {pb.Code.Name(code)} after {within} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start
