"""The gRPC servicer: translation only. Every method answers through
dledger.rpc.edge.answer, so errors become response codes in one place."""
from __future__ import annotations

from typing import AsyncIterator

import grpc

from dledger.errors import DLedgerError
from dledger.rpc.edge import REJECTS, answer, fill_header
from dledger.rpc.handler_capture import HandlerCapture
from dledger.rpc.append_stream import serve_append_stream
from dledger.rpc.peer_stream import serve_peer_stream
from dledger.rpc.stream_server import OpenStreams
from dledger.raw_run import RawRunResponse, serialize_read_response
from dledger.server import DLedgerServer
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc


def add_dledger_service(servicer: dledger_pb2_grpc.DLedgerServiceServicer, server: grpc.aio.Server) -> None:
    """The generated registration, but Read's answers may also be raw runs
    in wire form (dledger/raw_run.py), which its serializer writes as they are."""
    taken = HandlerCapture()
    dledger_pb2_grpc.add_DLedgerServiceServicer_to_server(servicer, taken)
    [(service, handlers)] = taken.registered.items()
    handlers["Read"] = grpc.unary_stream_rpc_method_handler(
        servicer.Read, request_deserializer=pb.ReadRequest.FromString,
        response_serializer=serialize_read_response)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class DLedgerServicer(dledger_pb2_grpc.DLedgerServiceServicer):
    def __init__(self, server: DLedgerServer, pid: int, metrics_address: str,
                 streams: OpenStreams | None = None) -> None:
        self.server = server
        self.pid = pid
        self.metrics_address = metrics_address
        # PeerStream and AppendStream end when the node stops (cluster/node.py).
        self.streams = streams

    @property
    def _ms(self):  # noqa: ANN202 - MemberState
        return self.server.member_state

    async def Vote(self, request: pb.VoteRequest, context: grpc.aio.ServicerContext) -> pb.VoteResponse:
        return await answer("Vote", self._ms, request, pb.VoteResponse,
                            lambda: self.server.handle_vote(request))

    async def HeartBeat(self, request: pb.HeartBeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartBeatResponse:
        return await answer("HeartBeat", self._ms, request, pb.HeartBeatResponse,
                            lambda: self.server.handle_heartbeat(request))

    async def Push(self, request: pb.PushEntryRequest, context: grpc.aio.ServicerContext) -> pb.PushEntryResponse:
        return await answer("Push", self._ms, request, pb.PushEntryResponse,
                            lambda: self.server.handle_push(request))

    async def PeerStream(self, request_iterator: AsyncIterator[pb.PeerStreamRequest],
                         context: grpc.aio.ServicerContext) -> None:
        # Requests are read with context.read(), so the iterator stays unused.
        await serve_peer_stream(self.server, context, self.streams)

    async def LeadershipTransfer(self, request: pb.LeadershipTransferRequest,
                                 context: grpc.aio.ServicerContext) -> pb.LeadershipTransferResponse:
        return await answer("LeadershipTransfer", self._ms, request, pb.LeadershipTransferResponse,
                            lambda: self.server.handle_leadership_transfer(request))

    async def Append(self, request: pb.AppendRequest, context: grpc.aio.ServicerContext) -> pb.AppendResponse:
        return await answer("Append", self._ms, request, pb.AppendResponse,
                            lambda: self.server.handle_append(request))

    async def AppendStream(self, request_iterator: AsyncIterator[pb.AppendStreamRequest],
                           context: grpc.aio.ServicerContext) -> None:
        await serve_append_stream(self.server, context, self.streams)

    async def Get(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> pb.GetResponse:
        return await answer("Get", self._ms, request, pb.GetResponse, lambda: self.server.handle_get(request))

    async def Metadata(self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext) -> pb.MetadataResponse:
        return await answer("Metadata", self._ms, request, pb.MetadataResponse,
                            lambda: self.server.handle_metadata(request, self.pid, self.metrics_address))

    async def ChangeMembership(self, request: pb.ChangeMembershipRequest,
                               context: grpc.aio.ServicerContext) -> pb.ChangeMembershipResponse:
        return await answer("ChangeMembership", self._ms, request, pb.ChangeMembershipResponse,
                            lambda: self.server.handle_change_membership(request))

    async def ListMembers(self, request: pb.ListMembersRequest,
                          context: grpc.aio.ServicerContext) -> pb.ListMembersResponse:
        return await answer("ListMembers", self._ms, request, pb.ListMembersResponse,
                            lambda: self.server.handle_list_members(request))

    async def Read(self, request: pb.ReadRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadResponse | RawRunResponse]:
        requester = request.header.local_id
        try:
            batches = await self.server.handle_read(request)
        except DLedgerError as e:
            REJECTS.note("Read", e)
            yield fill_header(pb.ReadResponse(), self._ms, requester, e.code, e.message, e.leader_id,
                              e.leader_address)
            return
        try:
            async for batch in batches:
                yield fill_header(batch, self._ms, requester, 200, "")
        except DLedgerError as e:   # met while streaming (a damaged entry, say)
            REJECTS.note("Read", e)
            yield fill_header(pb.ReadResponse(), self._ms, requester, e.code, e.message, e.leader_id,
                              e.leader_address)
