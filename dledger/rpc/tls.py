"""Transport security: the one place where gRPC servers get their port and
channels are opened, plaintext or TLS.

By default a node serves one plaintext gRPC port for everything (the
messaging, log, admin and health services, and the peer protocol). With
`tls_cert_file`/`tls_key_file` and the cluster CA `peer_tls_ca_file` (the
three go together), peers get a port of their own (the address in
`peers`) that requires a client certificate signed by the cluster CA, and
clients a TLS port without one (the advertised address): gRPC Python can
only require a client certificate or not ask for one, and the official
RocketMQ clients have none to give. A node dials its peers with its own
certificate and trusts only the cluster CA, so a process without a
certificate from that CA can neither vote, push, nor be pushed to (the
handshake fails both ways), and the client port refuses the peer protocol.

A half-made configuration (a certificate without its key, an unreadable or
expired file, a peer CA without a certificate) is refused with a one-line
TlsConfigError before anything is started.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import grpc


class TlsConfigError(ValueError):
    """The TLS settings cannot work; the message is one line."""


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes, read once at start."""
    cert: bytes = b""
    key: bytes = b""
    ca: bytes = b""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)

    @property
    def mutual(self) -> bool:
        return bool(self.cert and self.ca)


PLAINTEXT = TlsMaterial()


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise TlsConfigError(f"{what} {path!r} cannot be read: {error.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"{what} {path!r} is not a PEM file")
    return data


def _check_certificates(data: bytes, what: str, path: str) -> None:
    """Parse every certificate in `data`; refuse one that is expired or not
    yet valid (a node would otherwise start and fail every handshake)."""
    from cryptography import x509  # only needed when TLS is configured
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise TlsConfigError(f"{what} {path!r} holds no valid certificate: {error}") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    for certificate in certificates:
        if certificate.not_valid_after_utc < now:
            raise TlsConfigError(f"{what} {path!r} expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if certificate.not_valid_before_utc > now:
            raise TlsConfigError(f"{what} {path!r} is not valid before "
                                 f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")


def load_material(cert_file: str = "", key_file: str = "", ca_file: str = "") -> TlsMaterial:
    """Read and check a node's (or a client's) TLS files; all empty: plaintext."""
    if not cert_file and not key_file and not ca_file:
        return PLAINTEXT
    if bool(cert_file) != bool(key_file):
        missing = "tls_key_file" if cert_file else "tls_cert_file"
        raise TlsConfigError(f"TLS is half configured: {missing} is missing (both a certificate and its key "
                             f"are needed)")
    if ca_file and not cert_file:
        raise TlsConfigError("peer_tls_ca_file is set but tls_cert_file/tls_key_file are not: mutual TLS "
                             "between peers needs this node's own certificate")
    if cert_file and not ca_file:
        raise TlsConfigError("tls_cert_file is set but peer_tls_ca_file is not: peers verify each other "
                             "against the cluster CA (TLS for clients comes with mutual TLS for peers)")
    cert = _read(cert_file, "tls_cert_file")
    _check_certificates(cert, "tls_cert_file", cert_file)
    key = _read(key_file, "tls_key_file")
    if b"PRIVATE KEY" not in key:
        raise TlsConfigError(f"tls_key_file {key_file!r} holds no private key")
    ca = b""
    if ca_file:
        ca = _read(ca_file, "peer_tls_ca_file")
        _check_certificates(ca, "peer_tls_ca_file", ca_file)
    _check_pair(cert, key, cert_file, key_file)
    return TlsMaterial(cert, key, ca)


def _check_pair(cert: bytes, key: bytes, cert_file: str, key_file: str) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as error:
        raise TlsConfigError(f"tls_key_file {key_file!r} cannot be loaded: {error}") from None
    public = x509.load_pem_x509_certificates(cert)[0].public_key()
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*spki) != public.public_bytes(*spki):
        raise TlsConfigError(f"tls_key_file {key_file!r} is not the key of tls_cert_file {cert_file!r}")


def read_ca(ca_file: str) -> bytes:
    """A CA file a client trusts (checked like a node's)."""
    if not ca_file:
        return b""
    ca = _read(ca_file, "TLS CA file")
    _check_certificates(ca, "TLS CA file", ca_file)
    return ca


# ---------------------------------------------------------------- servers
def add_port(server: grpc.aio.Server, address: str, material: TlsMaterial, peer_port: bool = False) -> int:
    """Bind `address`: plaintext without a certificate, TLS with one; a peer
    port requires a client certificate signed by the cluster CA."""
    if not material.enabled:
        return server.add_insecure_port(address)
    if peer_port:
        credentials = grpc.ssl_server_credentials([(material.key, material.cert)],
                                                  root_certificates=material.ca, require_client_auth=True)
    else:
        credentials = grpc.ssl_server_credentials([(material.key, material.cert)])
    return server.add_secure_port(address, credentials)


# --------------------------------------------------------------- channels
def channel(address: str, options: list[tuple[str, Any]] | None = None, ca: bytes = b"",
            material: TlsMaterial = PLAINTEXT, interceptors: list[Any] | None = None) -> grpc.aio.Channel:
    """A client channel: plaintext without a CA; TLS trusting `ca` (or the
    node's peer CA), presenting the node's certificate when it has one
    (mutual TLS between peers)."""
    trusted = ca or material.ca
    if not trusted:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=trusted,
        private_key=material.key or None, certificate_chain=material.cert or None)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


def sync_channel(address: str, ca: bytes = b"") -> grpc.Channel:
    """A blocking channel (health checks), TLS when a CA is given."""
    if not ca:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))
