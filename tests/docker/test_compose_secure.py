"""deploy/docker-compose.secure.yml for real: the image, three containers
that elect over mutual TLS, become healthy through a health check over TLS,
and serve a signed client over TLS; an unsigned one is refused."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cluster import certs
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError
from dledger.rpc.credentials import ClientSecurity
from tests.docker.compose import NODE_IDS, ROOT, BuiltImage, ComposeProject, docker_unavailable_reason

SKIP_REASON = docker_unavailable_reason()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"docker end-to-end test skipped: {SKIP_REASON}"),
    pytest.mark.timeout(900),
]
SECRET = "compose-admin-secret"
CONTAINER_UID = 10001


def secure_dir(base: Path, servers: list[str]) -> Path:
    """What deploy/secure-setup.sh makes, for the test's own ports."""
    out = base / "secure"
    certs.create(out, list(NODE_IDS), endpoints=servers)
    (out / "admin.secret").write_text(SECRET + "\n")
    for path in [out, *out.iterdir()]:
        if os.geteuid() == 0:
            os.chown(path, CONTAINER_UID, -1)
        else:  # the container's user must read them; this is a throw-away test CA
            path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def test_the_secure_compose_cluster_serves_signed_tls_clients_only(image: BuiltImage, tmp_path: Path) -> None:
    project = ComposeProject(image.tag, compose_file=ROOT / "deploy" / "docker-compose.secure.yml")
    project.compose_env["PYDLEDGER_SECURE_DIR"] = str(secure_dir(tmp_path, project.servers))
    ca = (tmp_path / "secure" / "ca.pem").read_bytes()
    try:
        project.up()
        project.wait_healthy()
        asyncio.run(_check(project.servers, ca))
    finally:
        project.down()


async def _check(servers: list[str], ca: bytes) -> None:
    async with DLedgerClient(servers, security=ClientSecurity("admin", SECRET, ca), deadline_s=60) as client:
        result = await client.append([b"through mutual TLS"])
        assert (await client.get(result.first_index)).body == b"through mutual TLS"
    async with DLedgerClient(servers, security=ClientSecurity(ca=ca), deadline_s=5) as unsigned:
        with pytest.raises(DLedgerError, match="UNAUTHENTICATED"):
            await unsigned.append([b"unsigned"])
