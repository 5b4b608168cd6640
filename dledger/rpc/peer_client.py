"""GrpcTransport: the Transport the election and the pusher use to reach peers
over gRPC, one long-lived channel per peer."""
from __future__ import annotations

import grpc

from dledger.config import DLedgerConfig
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

# Pushes carry up to max_push_batch_bytes; leave headroom over gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly to a peer that restarts: failover time depends on it.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_retries", 0),
]


class GrpcTransport:
    def __init__(self, config: DLedgerConfig) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, dledger_pb2_grpc.DLedgerServiceStub] = {}
        for peer in config.peers:
            if peer.id == config.self_id:
                continue
            channel = grpc.aio.insecure_channel(peer.address, options=CHANNEL_OPTIONS)
            self._channels[peer.id] = channel
            self._stubs[peer.id] = dledger_pb2_grpc.DLedgerServiceStub(channel)

    def _stub(self, peer_id: str) -> dledger_pb2_grpc.DLedgerServiceStub:
        stub = self._stubs.get(peer_id)
        if stub is None:
            raise TransportError(f"no channel to {peer_id!r}")
        return stub

    async def _call(self, method, request, timeout: float):  # noqa: ANN001, ANN202
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise TransportError(f"{e.code().name}: {e.details()}") from None

    async def vote(self, peer_id: str, request: pb.VoteRequest, timeout: float) -> pb.VoteResponse:
        return await self._call(self._stub(peer_id).Vote, request, timeout)

    async def heartbeat(self, peer_id: str, request: pb.HeartBeatRequest, timeout: float) -> pb.HeartBeatResponse:
        return await self._call(self._stub(peer_id).HeartBeat, request, timeout)

    async def push(self, peer_id: str, request: pb.PushEntryRequest, timeout: float) -> pb.PushEntryResponse:
        return await self._call(self._stub(peer_id).Push, request, timeout)

    async def leadership_transfer(self, peer_id: str, request: pb.LeadershipTransferRequest,
                                  timeout: float) -> pb.LeadershipTransferResponse:
        return await self._call(self._stub(peer_id).LeadershipTransfer, request, timeout)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
