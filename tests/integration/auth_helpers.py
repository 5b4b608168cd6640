"""A cluster of node processes with auth on, and the super user's calls to
its AuthService, for the tests of authentication and ACLs."""
from __future__ import annotations

from pathlib import Path

from cluster.process_cluster import ProcessCluster
from dledger.rpc.credentials import ClientSecurity
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
