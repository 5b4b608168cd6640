"""PeerStream: replication on one long-lived bidirectional gRPC stream per
follower. The leader's end is a RequestStream (dledger/rpc/request_stream.py)
held by GrpcTransport; the follower's end is here.

A unary call costs Python gRPC several hundred microseconds of CPU at each
end (a new HTTP/2 stream, its headers, a deadline, a task on the server); a
message on a stream that is already open costs a fraction of that. So the
leader's pushes and heartbeats to a follower go out as messages on one open
stream, several in flight, and the follower writes each answer back on it
with the id of the request it answers.

The follower answers every request in its own task (stream_server.py), so
an APPEND waiting for its fsync holds up neither the heartbeat behind it nor
the next APPEND (exactly as concurrent unary calls did); tasks start in
arrival order, so the synchronous part of each (the write of an APPEND's
entries) happens in order.

A stream is not repaired: a request that gets no answer in time, or a
stream that breaks (a connection cut, a peer restarted), fails every request
still waiting on it with TransportError, exactly what a unary call's deadline
or a broken connection gave the caller (the dispatcher backs off and goes back
to COMPARE), and the next request opens a new stream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from dledger.rpc.edge import answer
from dledger.rpc.stream_server import OpenStreams, serve_each
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.server import DLedgerServer


async def answer_peer_request(server: DLedgerServer, request: pb.PeerStreamRequest) -> pb.PeerStreamResponse | None:
    """The answer to one push or heartbeat, on a PeerStream or a peer link
    (dledger/rpc/peer_link.py); None: the request carries neither."""
    response = pb.PeerStreamResponse(id=request.id)
    kind = request.WhichOneof("body")
    if kind == "push":
        push = request.push
        response.push.CopyFrom(await answer("Push", server.member_state, push, pb.PushEntryResponse,
                                            lambda: server.handle_push(push)))
    elif kind == "heartbeat":
        heartbeat = request.heartbeat
        response.heartbeat.CopyFrom(await answer("HeartBeat", server.member_state, heartbeat,
                                                 pb.HeartBeatResponse,
                                                 lambda: server.handle_heartbeat(heartbeat)))
    else:
        return None
    return response


async def serve_peer_stream(server: DLedgerServer, context: grpc.aio.ServicerContext,
                            streams: OpenStreams | None = None) -> None:
    """The follower's end: each request answered in its own task
    (dledger/rpc/stream_server.py), until the leader ends the stream, goes
    away, or this node stops (`streams` close)."""

    async def answer_one(request: pb.PeerStreamRequest) -> pb.PeerStreamResponse | None:
        response = await answer_peer_request(server, request)
        if response is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"PeerStream request {request.id} carries neither a push nor a heartbeat")
        return response

    await serve_each(context, answer_one, streams)
