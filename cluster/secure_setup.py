"""What `dledger cluster up --secure` prepares under `<data-dir>/secure/`:
the CA (`ca.pem`; its key `ca.key`), one certificate per node (and one for
the name server, `namesrv`, with several groups), and the super
user `admin`'s secret (`admin.secret`, mode 0600, random). Made once and
kept: a second `cluster up --secure` on the same data dir reuses them (the
nodes' logs already hold users whose policies refer to that cluster)."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from dledger.rpc.credentials import ClientSecurity, read_secret

# Peers talk mutual TLS on BASE+200+i (clients on BASE+i, metrics BASE+100+i).
PEER_PORT_OFFSET = 200
ADMIN_USER = "admin"


@dataclass(frozen=True)
class SecureSetup:
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def admin_secret_file(self) -> Path:
        return self.directory / "admin.secret"

    @classmethod
    def prepare(cls, data_dir: Path, node_ids: list[str], client_addresses: list[list[str]]) -> "SecureSetup":
        """`client_addresses`: each broker group's nodes' client addresses."""
        setup = cls(data_dir / "secure")
        missing = not setup.ca_file.exists() or any(not (setup.directory / f"{n}.pem").exists() for n in node_ids)
        if missing:
            from cluster import certs
            certs.create(setup.directory, node_ids, endpoint_groups=client_addresses)
        if not setup.admin_secret_file.exists():
            fd = os.open(setup.admin_secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24) + "\n")
        return setup

    def node_args(self, node_id: str) -> list[str]:
        """A node's flags; a name server takes the same (its id `namesrv`)."""
        return ["--tls-cert-file", str(self.directory / f"{node_id}.pem"),
                "--tls-key-file", str(self.directory / f"{node_id}-key.pem"),
                "--peer-tls-ca-file", str(self.ca_file),
                "--auth-enabled", "true", "--auth-super-user", ADMIN_USER,
                "--auth-super-secret-file", str(self.admin_secret_file)]

    def admin_security(self) -> ClientSecurity:
        return ClientSecurity(ADMIN_USER, read_secret(str(self.admin_secret_file)), self.ca_file.read_bytes())
