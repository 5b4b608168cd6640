"""PeerOnlyGuard: with mutual TLS, the peer protocol lives on the members-only
port; on the client port a Vote, HeartBeat, Push, PeerStream or relay stream
is refused before it reaches the servicer, so a client (which presents no
certificate) cannot disturb an election or a follower's log, nor relay calls
past the client port's checks."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import grpc

from broker.relay import RELAY_METHOD
from rpcgen import dledger_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["DLedgerService"].full_name
# LeadershipTransfer stays: operators ask for it on the client port.
PEER_ONLY_METHODS = frozenset(f"/{_SERVICE}/{m}" for m in ("Vote", "HeartBeat", "Push"))
# Replication's stream (pushes and heartbeats on one call per follower), and
# the relay of forwarded calls (broker/relay.py: the members' port serves it
# without the client port's checks, as it serves forwarded calls).
PEER_ONLY_STREAMS = frozenset({f"/{_SERVICE}/PeerStream", RELAY_METHOD})
FIRST_REQUEST_WAIT_S = 1.0


def _refuse(request: Any, context: grpc.aio.ServicerContext) -> Awaitable[Any]:
    return context.abort(grpc.StatusCode.PERMISSION_DENIED,
                         "the peer protocol is served on the members' mutual-TLS port only")


async def _refuse_stream(requests: Any, context: grpc.aio.ServicerContext) -> None:
    # Take the first request (a peer writes at once) before ending the call:
    # ended while the client's write was still in flight, the call reached the
    # client as INTERNAL (RST_STREAM) now and then, not as the refusal below.
    try:
        await asyncio.wait_for(anext(aiter(requests), None), FIRST_REQUEST_WAIT_S)
    except (asyncio.TimeoutError, grpc.RpcError, StopAsyncIteration):
        pass
    await _refuse(None, context)


class PeerOnlyGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        if handler_call_details.method in PEER_ONLY_METHODS:
            return grpc.unary_unary_rpc_method_handler(_refuse)
        if handler_call_details.method in PEER_ONLY_STREAMS:
            return grpc.stream_stream_rpc_method_handler(_refuse_stream)
        return await continuation(handler_call_details)
