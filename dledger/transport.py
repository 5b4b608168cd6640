"""How the election and the pusher reach peers: a small interface, so the Raft
rules can be driven through an in-memory transport in tests and through gRPC
(dledger/rpc/peer_client.py) in a real node."""
from __future__ import annotations

from typing import Protocol

from rpcgen import dledger_pb2 as pb


class TransportError(Exception):
    """The peer could not be reached or did not answer in time."""


class Transport(Protocol):
    async def vote(self, peer_id: str, request: pb.VoteRequest, timeout: float) -> pb.VoteResponse: ...
    async def heartbeat(self, peer_id: str, request: pb.HeartBeatRequest, timeout: float) -> pb.HeartBeatResponse: ...
    async def push(self, peer_id: str, request: pb.PushEntryRequest, timeout: float) -> pb.PushEntryResponse: ...
    async def leadership_transfer(self, peer_id: str, request: pb.LeadershipTransferRequest,
                                  timeout: float) -> pb.LeadershipTransferResponse: ...
    def update_peers(self, addresses: dict[str, str]) -> None:
        """The membership changed: reach exactly these peers (id -> HOST:PORT)."""
    async def close(self) -> None: ...
