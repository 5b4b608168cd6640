"""`dledger cluster up --secure`: one command for a local cluster with TLS,
mutual TLS between peers, authentication and ACLs; the CLI reaches it with
the CA and admin secret the launcher wrote, and nothing without them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.process_cluster import ROOT
from tests.integration.test_cli import free_base_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dledger(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_cluster_up_secure_serves_only_those_with_the_ca_and_a_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = free_base_port(3)
    launcher = subprocess.Popen([sys.executable, "-m", "cluster.cli", "cluster", "up", "--nodes", "3",
                                 "--data-dir", str(data), "--base-port", str(base), "--secure"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        lines = []
        assert launcher.stdout is not None
        while time.monotonic() < deadline:
            line = launcher.stdout.readline()
            lines.append(line)
            if line.startswith("ready"):
                break
        else:
            pytest.fail("".join(lines))
        secure = data / "secure"
        assert (secure / "ca.pem").exists()
        assert (secure / "admin.secret").stat().st_mode & 0o777 == 0o600
        servers = ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        creds = ["--user", "admin", "--secret-file", str(secure / "admin.secret"), "--tls-ca", str(secure / "ca.pem")]
        appended = dledger("append", "--servers", servers, "--data", "secured", "--json", *creds)
        assert appended.returncode == 0, appended.stderr
        assert json.loads(appended.stdout)["appended"] == 1
        # The same through the environment.
        env = {"DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": str(secure / "admin.secret"),
               "DLEDGER_TLS_CA": str(secure / "ca.pem")}
        sent = dledger("send", "--servers", servers, "--topic", "SecureUp", "--body", "hi", env=env)
        assert sent.returncode == 0, sent.stderr
        # With the CA but no secret: refused (plaintext: tests/integration/test_tls_cluster.py).
        unsigned = dledger("append", "--servers", servers, "--data", "x", "--tls-ca", str(secure / "ca.pem"))
        assert unsigned.returncode != 0 and "UNAUTHENTICATED" in unsigned.stderr
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
