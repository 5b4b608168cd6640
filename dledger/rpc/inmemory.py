"""An in-memory network of DLedger nodes: the Raft rules driven without
sockets (hashicorp/raft's inmem transport, for this codebase).

Links can be cut in one direction or both; a cut request never arrives, a cut
reply is lost after the peer has acted on the request (as on a real network).
Messages are copied through their wire encoding, so no state is shared.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from dledger.rpc.edge import answer
from dledger.server import DLedgerServer
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb

Resp = TypeVar("Resp")


class InMemoryNetwork:
    def __init__(self) -> None:
        self.servers: dict[str, DLedgerServer] = {}
        self.cut: set[tuple[str, str]] = set()   # (from, to) pairs that drop messages
        self.delay_s = 0.0

    def transport(self, self_id: str) -> "InMemoryTransport":
        return InMemoryTransport(self, self_id)

    def register(self, server: DLedgerServer) -> None:
        self.servers[server.config.self_id] = server

    def isolate(self, node: str) -> None:
        for other in self.servers:
            if other != node:
                self.cut |= {(node, other), (other, node)}

    def cut_one_way(self, src: str, dst: str) -> None:
        self.cut.add((src, dst))

    def heal(self) -> None:
        self.cut.clear()


class InMemoryTransport:
    def __init__(self, network: InMemoryNetwork, self_id: str) -> None:
        self.network = network
        self.self_id = self_id

    async def _deliver(self, peer_id: str, method: str, request: object, response_type: type[Resp],
                       call: Callable[[DLedgerServer, object], Awaitable[Resp] | Resp], timeout: float) -> Resp:
        net = self.network
        await asyncio.sleep(net.delay_s)
        server = net.servers.get(peer_id)
        if (self.self_id, peer_id) in net.cut or server is None or not server.started:
            raise TransportError(f"{peer_id} unreachable from {self.self_id}")
        copy = type(request).FromString(request.SerializeToString())  # type: ignore[attr-defined]
        try:
            response = await asyncio.wait_for(
                answer(method, server.member_state, copy, response_type, lambda: call(server, copy)), timeout)
        except asyncio.TimeoutError:
            raise TransportError(f"{method} to {peer_id} timed out") from None
        if (peer_id, self.self_id) in net.cut or not server.started:
            raise TransportError(f"reply from {peer_id} lost")
        return type(response).FromString(response.SerializeToString())  # type: ignore[attr-defined]

    async def vote(self, peer_id: str, request: pb.VoteRequest, timeout: float) -> pb.VoteResponse:
        return await self._deliver(peer_id, "Vote", request, pb.VoteResponse, lambda s, r: s.handle_vote(r), timeout)

    async def heartbeat(self, peer_id: str, request: pb.HeartBeatRequest, timeout: float) -> pb.HeartBeatResponse:
        return await self._deliver(peer_id, "HeartBeat", request, pb.HeartBeatResponse,
                                   lambda s, r: s.handle_heartbeat(r), timeout)

    async def push(self, peer_id: str, request: pb.PushEntryRequest, timeout: float) -> pb.PushEntryResponse:
        return await self._deliver(peer_id, "Push", request, pb.PushEntryResponse,
                                   lambda s, r: s.handle_push(r), timeout)

    async def leadership_transfer(self, peer_id: str, request: pb.LeadershipTransferRequest,
                                  timeout: float) -> pb.LeadershipTransferResponse:
        return await self._deliver(peer_id, "LeadershipTransfer", request, pb.LeadershipTransferResponse,
                                   lambda s, r: s.handle_leadership_transfer(r), timeout)

    def update_peers(self, addresses: dict[str, str]) -> None:
        pass  # the network knows every server by id

    async def close(self) -> None:
        pass
