"""`python -m cluster.healthcheck [HOST:PORT]`: exit 0 when the node answers
SERVING on the standard gRPC health service (grpc.health.v1) for
dledger.v1.DLedgerService, 1 otherwise, with one line saying why.

The container HEALTHCHECK runs this every few seconds in every node, so it does
the least it can: one Check call with a short deadline, no client library, no
leader lookup. Without an address it asks 127.0.0.1 on the port the node
listens on, worked out from the same DLEDGER_ variables the node reads.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.config import ConfigError, config_from_args

SERVICE = "dledger.v1.DLedgerService"
DEFAULT_PORT = 20911
# Docker's own timeout for the check should be longer than this.
TIMEOUT_S = 2.0


def own_address(environ: Mapping[str, str]) -> str:
    """127.0.0.1 on the node's gRPC port; the default port when the node was
    configured by flags this process cannot see."""
    try:
        config = config_from_args(argparse.Namespace(), environ)
    except ConfigError:
        return f"127.0.0.1:{DEFAULT_PORT}"
    port = config.bind_address.rpartition(":")[2]
    return f"127.0.0.1:{port}"


def check(address: str, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    with grpc.insecure_channel(address) as channel:
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
    healthy, message = check(address)
    print(message, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
