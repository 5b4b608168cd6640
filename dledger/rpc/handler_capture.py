"""A stand-in for a gRPC server that a generated `add_XServicer_to_server`
registers into, keeping what it registers: the node's DLedgerService
registration swaps one method's serializer before the real server gets the
handlers (dledger/rpc/service.py), and the broker's relay runs relayed calls
through the messaging service's own handlers (broker/relay.py)."""
from __future__ import annotations

from collections.abc import Iterable

import grpc


class HandlerCapture:
    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler] = []
        # Service name -> method name -> handler, as add_registered_method_handlers gets them.
        self.registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.registered[service] = dict(handlers)
