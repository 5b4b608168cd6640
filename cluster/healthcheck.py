"""`python -m cluster.healthcheck [HOST:PORT]`: exit 0 when the node answers
SERVING on the standard gRPC health service (grpc.health.v1) for
dledger.v1.DLedgerService, 1 otherwise, with one line saying why.

The container HEALTHCHECK runs this every few seconds in every node, so it does
the least it can: one Check call with a short deadline, no client library, no
leader lookup. Without an address it asks 127.0.0.1 on the port the node
listens on, worked out from the same DLEDGER_ variables the node reads; over
TLS (trusting DLEDGER_TLS_CA, or the node's DLEDGER_PEER_TLS_CA_FILE) when the
node has a certificate. Health needs no credentials.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.config import ConfigError, config_from_args
from dledger.rpc import tls

SERVICE = "dledger.v1.DLedgerService"
DEFAULT_PORT = 20911
# Docker's own timeout for the check should be longer than this.
TIMEOUT_S = 2.0


def own_address(environ: Mapping[str, str]) -> str:
    """127.0.0.1 on the node's gRPC port (its client port with TLS); the
    default port when the node was configured by flags this process cannot see."""
    try:
        config = config_from_args(argparse.Namespace(), environ)
    except ConfigError:
        return f"127.0.0.1:{DEFAULT_PORT}"
    port = (config.client_bind_address if config.mutual_tls else config.bind_address).rpartition(":")[2]
    return f"127.0.0.1:{port}"


def own_ca(environ: Mapping[str, str]) -> bytes:
    """The CA to trust: DLEDGER_TLS_CA, else the node's own cluster CA."""
    path = environ.get("DLEDGER_TLS_CA") or environ.get("DLEDGER_PEER_TLS_CA_FILE", "")
    return tls.read_ca(path) if path else b""


def check(address: str, timeout_s: float = TIMEOUT_S, ca: bytes = b"") -> tuple[bool, str]:
    with tls.sync_channel(address, ca) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout_s)
        except grpc.RpcError as error:
            return False, f"{address}: {error.code().name}"  # type: ignore[attr-defined]
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return answer.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    address = args[0] if args else own_address(os.environ)
    healthy, message = check(address, ca=own_ca(os.environ))
    print(message, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
