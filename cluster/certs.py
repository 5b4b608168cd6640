"""`dledger certs create`: a certificate authority and one certificate per node.

etcd and NATS ask operators to bring their own PKI; that is right for
production and a wall for a first secure cluster. This makes a private CA
(EC P-256, ten years) and, per node, a key and a certificate signed by it
whose subject alternative names cover every way the node is reached: its
id (the container name under compose), `localhost`, `127.0.0.1` and the
extra `--hosts`. The official RocketMQ Python client checks the host name
against the SANs, so an IP SAN is needed for `127.0.0.1:port` endpoints; and
since it dials all of a route's addresses as one target, a SAN naming that
whole address list (`--endpoints`, see `endpoints_name`) as well.

Each node certificate is usable both as a server certificate (clients and
peers connect to it) and as a client certificate (it dials its peers over
mutual TLS), so one pair per node is enough. A `client` certificate is made
as well, for tools that want to present one. Keys are written mode 0600.
A CA already in the directory is kept and signs the new certificates, so
that a node added later (`dledger member add`) is trusted by the others.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=3650)
NODE_VALIDITY = datetime.timedelta(days=825)
DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Pair:
    cert_file: Path
    key_file: Path


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` 0600 from the start (no window in which another user
    could open it), replacing an older file."""
    if path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o644)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # unique, in order
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(out: Path, name: str = "pydledger CA",
            not_before: datetime.datetime | None = None,
            validity: datetime.timedelta = CA_VALIDITY) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_public(out / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write_private(out / "ca.key", _key_pem(key))
    return cert, key


def make_leaf(out: Path, name: str, hosts: list[str], ca_cert: x509.Certificate,
              ca_key: ec.EllipticCurvePrivateKey, not_before: datetime.datetime | None = None,
              validity: datetime.timedelta = NODE_VALIDITY) -> Pair:
    """A certificate for `name` (server and client use), signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pair = Pair(out / f"{name}.pem", out / f"{name}-key.pem")
    _write_public(pair.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pair.key_file, _key_pem(key))
    return pair


def endpoints_name(addresses: list[str]) -> str:
    """The host name the official RocketMQ Python client verifies when it
    connects to several addresses at once: it dials
    `ipv4:<address>,<address>,...` (the addresses sorted as text), and gRPC
    checks that whole list, as one name, against the certificate."""
    return ",".join(sorted(addresses))


def load_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The CA already in `out` (`ca.pem` and `ca.key`), or None."""
    cert_file, key_file = out / "ca.pem", out / "ca.key"
    if not cert_file.exists() or not key_file.exists():
        return None
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_file} is not an EC key made by `dledger certs create`")
    return cert, key


def create(out: Path, nodes: list[str], hosts: list[str] | None = None,
           endpoints: list[str] | None = None, endpoint_groups: list[list[str]] | None = None) -> dict[str, Pair]:
    """The CA (`ca.pem`, `ca.key`) and `<node>.pem`/`<node>-key.pem` for each
    node, plus `client.pem`/`client-key.pem`, under `out`. A CA already in
    `out` signs the new certificates (a node added to a running cluster must
    be trusted by its members); otherwise one is made. `endpoints`: the
    client addresses of every node, for the official Python client's TLS;
    `endpoint_groups`: the same per broker group (its client dials each
    group's addresses as one target)."""
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    ca_cert, ca_key = load_ca(out) or make_ca(out)
    extra = [*DEFAULT_HOSTS, *(hosts or [])]
    for addresses in ([endpoints] if endpoints else []) + list(endpoint_groups or []):
        extra.append(endpoints_name(addresses))
    pairs = {node: make_leaf(out, node, [node, *extra], ca_cert, ca_key) for node in nodes}
    pairs["client"] = make_leaf(out, "client", ["client"], ca_cert, ca_key)
    return pairs
