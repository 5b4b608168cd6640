"""A node refuses a half-made TLS configuration with a one-line error."""
from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import certs
from cluster.process_cluster import ROOT, free_ports
from dledger.rpc import tls


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pki")
    certs.create(out, ["n0", "n1"])
    return out


def test_certs_have_the_sans_clients_check_and_private_keys_are_0600(pki: Path) -> None:
    from cryptography import x509
    cert = x509.load_pem_x509_certificate((pki / "n0.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"n0", "localhost"} <= set(san.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    for key in ("ca.key", "n0-key.pem", "client-key.pem"):
        assert (pki / key).stat().st_mode & 0o777 == 0o600


def test_complete_material_loads(pki: Path) -> None:
    material = tls.load_material(str(pki / "n0.pem"), str(pki / "n0-key.pem"), str(pki / "ca.pem"))
    assert material.enabled and material.mutual
    assert tls.load_material() is tls.PLAINTEXT


@pytest.mark.parametrize("files, message", [
    (("n0.pem", "", "ca.pem"), "tls_key_file is missing"),
    (("", "n0-key.pem", "ca.pem"), "tls_cert_file is missing"),
    (("n0.pem", "n0-key.pem", ""), "peer_tls_ca_file is not"),
    (("", "", "ca.pem"), "needs this node's own certificate"),
    (("missing.pem", "n0-key.pem", "ca.pem"), "cannot be read"),
    (("n0.pem", "n1-key.pem", "ca.pem"), "is not the key of"),
    (("n0-key.pem", "n0.pem", "ca.pem"), "holds no valid certificate"),
])
def test_half_made_configurations_are_refused(pki: Path, files: tuple[str, str, str], message: str) -> None:
    paths = [str(pki / f) if f else "" for f in files]
    with pytest.raises(tls.TlsConfigError, match=message):
        tls.load_material(*paths)


def test_an_expired_certificate_is_refused(pki: Path, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography import x509
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
    pair = certs.make_leaf(tmp_path, "old", ["localhost"], ca_cert, ca_key, not_before=past,  # type: ignore[arg-type]
                           validity=datetime.timedelta(days=1))
    with pytest.raises(tls.TlsConfigError, match="expired on"):
        tls.load_material(str(pair.cert_file), str(pair.key_file), str(pki / "ca.pem"))


def test_a_node_with_a_half_made_tls_config_exits_with_one_line(pki: Path, tmp_path: Path) -> None:
    peer, client = free_ports(2)
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "node", "--id", "n0", "--peers", f"n0=127.0.0.1:{peer}",
         "--advertised-addresses", f"n0=127.0.0.1:{client}", "--data-dir", str(tmp_path / "n0"),
         "--tls-cert-file", str(pki / "n0.pem"), "--peer-tls-ca-file", str(pki / "ca.pem")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line or "error" in line]
    assert len(errors) == 1 and "tls_key_file is missing" in errors[0], proc.stderr


def test_a_shell_with_client_credentials_exported_can_still_start_nodes() -> None:
    import argparse
    from cluster.config import config_from_args
    config = config_from_args(argparse.Namespace(), {
        "DLEDGER_ID": "n0", "DLEDGER_PEERS": "n0=127.0.0.1:1", "DLEDGER_DATA_DIR": "/tmp/x",
        "DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": "/s", "DLEDGER_TLS_CA": "/ca.pem"})
    assert config.self_id == "n0" and not config.auth_enabled
