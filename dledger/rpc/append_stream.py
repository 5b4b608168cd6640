"""AppendStream, the leader's end: a client's appends as messages on one
long-lived stream, each answered as its entries commit (in its own task,
dledger/rpc/stream_server.py), with the id of the message it answers.

One message may carry the appends of several callers that the client
coalesced (`counts`: bodies per caller). Each caller's bodies are checked on
their own, so one caller's oversized body fails that caller only; the bodies
that pass are appended in one batch under the message's one producer
sequence (a retry of the message carries the same bodies, is checked the same
way, and is recognised as a repeat). Every caller gets its own outcome: its
indexes, or its error.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from dledger.errors import DLedgerError, ResponseCode
from dledger.rpc.edge import answer
from dledger.rpc.stream_server import OpenStreams, serve_each
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.server import DLedgerServer


async def serve_append_stream(server: DLedgerServer, context: grpc.aio.ServicerContext,
                              streams: OpenStreams | None = None) -> None:
    async def answer_one(request: pb.AppendStreamRequest) -> pb.AppendStreamResponse:
        return await answer_append(server, request)

    await serve_each(context, answer_one, streams)


def split_callers(request: pb.AppendStreamRequest) -> list[list[bytes]]:
    """The bodies of each caller, in order; UNEXPECTED_ARGUMENT when the
    counts do not add up to the bodies carried."""
    bodies = list(request.append.bodies)
    counts = list(request.counts) or [len(bodies)]
    if any(count < 0 for count in counts) or sum(counts) != len(bodies):
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"counts {counts[:8]}{'...' if len(counts) > 8 else ''} do not add up to the "
                           f"{len(bodies)} bodies carried")
    callers, offset = [], 0
    for count in counts:
        callers.append(bodies[offset:offset + count])
        offset += count
    return callers


async def answer_append(server: DLedgerServer, request: pb.AppendStreamRequest) -> pb.AppendStreamResponse:
    sizes: list[int] = []                      # bodies per caller
    refused: dict[int, DLedgerError] = {}      # caller number -> why

    async def append() -> pb.AppendStreamResponse:
        append_request = request.append
        server.check_group(append_request.header)
        if append_request.retry_age_ms < 0:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"retry_age_ms {append_request.retry_age_ms} is negative")
        accepted: list[bytes] = []
        for number, bodies in enumerate(split_callers(request)):
            sizes.append(len(bodies))
            try:
                server.check_bodies(bodies)
            except DLedgerError as error:
                refused[number] = error
                continue
            accepted.extend(bodies)
        if not accepted:   # the header says SUCCESS, each caller its refusal
            return pb.AppendStreamResponse(first_index=-1, last_index=-1)
        first, last, positions = await server.append(accepted, append_request.producer_id,
                                                     append_request.sequence,
                                                     retry_age_ms=append_request.retry_age_ms)
        return pb.AppendStreamResponse(first_index=first, last_index=last, positions=positions)

    response = await answer("AppendStream", server.member_state, request.append, pb.AppendStreamResponse, append)
    response.id = request.id
    response.link_port = server.client_link_port   # where the client may move its appends
    if response.header.code == ResponseCode.SUCCESS:
        next_index = response.first_index
        for number, count in enumerate(sizes):
            outcome = response.outcomes.add()
            if number in refused:
                outcome.code, outcome.message = refused[number].code, refused[number].message
                continue
            outcome.code = ResponseCode.SUCCESS
            outcome.first_index, outcome.last_index = next_index, next_index + count - 1
            next_index += count
    return response
