"""Client side of RocketMQ 5's request signature, and a client's security
settings (credentials and the CA it trusts), for every client of ours.

Each call carries `x-mq-date-time` (`%Y%m%dT%H%M%SZ`) and
`authorization: MQv2-HMAC-SHA1 Credential=<user>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1 of the date-time keyed by the secret>`, exactly as
the official clients send it, so that one server check serves them and us.
The header is added by a channel interceptor, so that no call site can
forget it. The signature is recomputed only when the second changes.

`ClientSecurity.from_env` reads DLEDGER_USER, DLEDGER_SECRET_FILE and
DLEDGER_TLS_CA, for tools that take no flags.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from dledger.rpc import tls

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
NAMESPACE = "x-mq-namespace"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
ENV_USER = "DLEDGER_USER"
ENV_SECRET_FILE = "DLEDGER_SECRET_FILE"
ENV_TLS_CA = "DLEDGER_TLS_CA"


def signature(secret: str, date_time: str) -> str:
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization_value(user: str, secret: str, date_time: str) -> str:
    return (f"{ALGORITHM} Credential={user}, SignedHeaders={DATE_TIME}, "
            f"Signature={signature(secret, date_time)}")


def date_time_now(now: float | None = None) -> str:
    """UTC (the official Python client uses its local time; the server
    accepts both readings, cluster/security/authn.py)."""
    return time.strftime(DATE_TIME_FORMAT, time.gmtime(time.time() if now is None else now))


def read_secret(path: str) -> str:
    """A secret file: its first line, without surrounding white space."""
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.readline().strip()
    except OSError as error:
        raise ValueError(f"secret file {path!r} cannot be read: {error.strerror}") from None
    if not secret:
        raise ValueError(f"secret file {path!r} is empty")
    return secret


@dataclass(frozen=True)
class ClientSecurity:
    user: str = ""
    secret: str = ""
    ca: bytes = b""         # PEM; empty: plaintext
    namespace: str = ""

    @classmethod
    def from_settings(cls, user: str | None = None, secret_file: str | None = None, tls_ca: str | None = None,
                      namespace: str = "", environ: dict[str, str] | None = None) -> "ClientSecurity":
        """Flags first, then DLEDGER_USER, DLEDGER_SECRET_FILE, DLEDGER_TLS_CA."""
        env = os.environ if environ is None else environ
        user = user or env.get(ENV_USER, "")
        secret_file = secret_file or env.get(ENV_SECRET_FILE, "")
        ca_file = tls_ca or env.get(ENV_TLS_CA, "")
        if bool(user) != bool(secret_file):
            raise ValueError("credentials need both a user (--user or DLEDGER_USER) and a secret file "
                             "(--secret-file or DLEDGER_SECRET_FILE)")
        secret = read_secret(secret_file) if secret_file else ""
        return cls(user, secret, tls.read_ca(ca_file), namespace)

    @classmethod
    def from_env(cls) -> "ClientSecurity":
        return cls.from_settings()

    def channel(self, address: str, options: list[tuple[str, Any]] | None = None, sign: bool = True
                ) -> grpc.aio.Channel:
        """A channel to `address`; with `sign`, every call on it is signed by
        an interceptor. A hot path that passes metadata on every call anyway
        is cheaper signing itself (`signer`): grpc.aio's client interceptors
        cost a few tens of microseconds per call."""
        interceptors = signing_interceptors(self.user, self.secret, self.namespace) if self.user and sign else None
        return tls.channel(address, options, ca=self.ca, interceptors=interceptors)

    def signer(self) -> "_Signer | None":
        """The signed headers for callers that add them to each call's metadata."""
        return _Signer(self.user, self.secret, "") if self.user else None


class _Signer:
    """The two headers, recomputed once per second at most."""

    def __init__(self, user: str, secret: str, namespace: str, clock: Callable[[], float] = time.time) -> None:
        self.user, self.secret, self.namespace, self.clock = user, secret, namespace, clock
        self._second = -1
        self._headers: tuple[tuple[str, str], ...] = ()

    def headers(self) -> tuple[tuple[str, str], ...]:
        now = self.clock()
        if int(now) != self._second:
            self._second = int(now)
            date_time = date_time_now(now)
            headers = [(DATE_TIME, date_time), (AUTHORIZATION, authorization_value(self.user, self.secret,
                                                                                     date_time))]
            if self.namespace:
                headers.append((NAMESPACE, self.namespace))
            self._headers = tuple(headers)
        return self._headers


def _with_headers(details: grpc.aio.ClientCallDetails, headers: tuple[tuple[str, str], ...]
                  ) -> grpc.aio.ClientCallDetails:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k not in (DATE_TIME, AUTHORIZATION)]
    metadata.extend(headers)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, grpc.aio.Metadata(*metadata),
                                      details.credentials, details.wait_for_ready)


# grpc.aio files an interceptor under the first of the four kinds it is an
# instance of, so each kind needs a class of its own (sharing one signer).
class _SignUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, signer: _Signer) -> None:
        self._signer = signer

    async def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return await continuation(_with_headers(details, self._signer.headers()), request)


class _SignUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, signer: _Signer) -> None:
        self._signer = signer

    async def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return await continuation(_with_headers(details, self._signer.headers()), request)


class _SignStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, signer: _Signer) -> None:
        self._signer = signer

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return await continuation(_with_headers(details, self._signer.headers()), request_iterator)


class _SignStreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, signer: _Signer) -> None:
        self._signer = signer

    async def intercept_stream_stream(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return await continuation(_with_headers(details, self._signer.headers()), request_iterator)


def signed_headers(user: str, secret: str) -> Callable[[], tuple[tuple[str, str], ...]]:
    """The headers that sign a call as `user`, fresh each second (for a
    stream opened by hand, with its metadata)."""
    return _Signer(user, secret, "").headers


def signing_interceptors(user: str, secret: str, namespace: str = "") -> list[Any]:
    signer = _Signer(user, secret, namespace)
    return [kind(signer) for kind in (_SignUnaryUnary, _SignUnaryStream, _SignStreamUnary, _SignStreamStream)]
