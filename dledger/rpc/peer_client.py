"""GrpcTransport: the Transport the election and the pusher use to reach peers,
one long-lived gRPC channel per peer. Pushes and heartbeats travel on the
peer's link (dledger/rpc/peer_link.py, a TCP connection of their own) once a
heartbeat answer has named its port, else as messages on one long-lived
PeerStream per peer (dledger/rpc/peer_stream.py); votes and leadership
transfers, rare, stay unary calls."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import grpc

from dledger.config import DLedgerConfig
from dledger.rpc import tls
from dledger.rpc.channel import channel_options
from dledger.rpc.credentials import signing_interceptors
from dledger.rpc import peer_link
from dledger.rpc.link import LINK_DIAL_TIMEOUT_S, LINK_REFUSED_RETRY_S, LINK_RETRY_S, LinkDialer
from dledger.rpc.request_stream import RequestStream, StreamFailure
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

log = logging.getLogger(__name__)

# Pushes carry up to max_push_batch_bytes; leave headroom over gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = channel_options(MAX_MESSAGE_BYTES, max_reconnect_backoff_ms=500) + [("grpc.enable_retries", 0)]


# A peer unreachable for this long gets a new channel. A channel resolves a
# host name once and, after failures, retries DNS only after gRPC's own
# backoff (minutes): a container that comes back from a network cut with a
# new address would stay unreachable that long. A new channel resolves anew.
RENEW_FAILING_CHANNEL_AFTER_S = 5.0
RETIRED_CHANNEL_GRACE_S = 2.0
# A peer of an earlier version has no PeerStream (UNIMPLEMENTED): it gets
# unary Push and HeartBeat calls, and the stream is tried again after this
# long (it may have been upgraded meanwhile). A rolling upgrade thus mixes
# versions without a stop.
UNARY_FALLBACK_S = 30.0


class GrpcTransport:
    def __init__(self, config: DLedgerConfig, material: tls.TlsMaterial = tls.PLAINTEXT,
                 signing: tuple[str, str] | None = None) -> None:
        # With the cluster CA: mutual TLS, this node's certificate presented.
        self._tls = material
        # With auth on: (user, secret) of the bootstrap super user, which
        # every member holds, so that peer calls pass a port that checks
        # signatures (one shared port, without mutual TLS).
        self._signing = signing
        self._dial = config.dial_address
        self._addresses = {p.id: p.address for p in config.peers if p.id != config.self_id}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, dledger_pb2_grpc.DLedgerServiceStub] = {}
        self._failing_since: dict[str, float] = {}
        self._streams: dict[str, RequestStream[pb.PeerStreamRequest, pb.PeerStreamResponse]] = {}
        self._unary_until: dict[str, float] = {}   # peers without PeerStream, until when
        self._closing: set[asyncio.Task[None]] = set()
        self._group, self._self_id = config.group, config.self_id
        self._link_context = (peer_link.client_context(config.tls_cert_file, config.tls_key_file,
                                                       config.peer_tls_ca_file) if config.mutual_tls else None)
        self._link_ports: dict[str, int] = {}          # learnt from heartbeat answers
        self._dialer: LinkDialer[str, peer_link.PeerLink] = LinkDialer("peer link", "PeerStream", LINK_RETRY_S,
                                                                       LINK_REFUSED_RETRY_S)
        self._links = self._dialer.links
        # Pushes and heartbeats sent, by the path they took (metrics, tests).
        self.requests_by_path = {"link": 0, "stream": 0, "unary": 0}
        self.link_dials = self._dialer.dials   # by outcome (metrics)
        for peer_id in self._addresses:
            self._open(peer_id)

    def _open(self, peer_id: str) -> None:
        self._drop_stream(peer_id, "the channel was replaced")
        interceptors = signing_interceptors(*self._signing) if self._signing else None
        channel = tls.channel(self._dial(self._addresses[peer_id]), CHANNEL_OPTIONS, material=self._tls,
                              interceptors=interceptors)
        self._channels[peer_id] = channel
        self._stubs[peer_id] = dledger_pb2_grpc.DLedgerServiceStub(channel)

    def _stub(self, peer_id: str) -> dledger_pb2_grpc.DLedgerServiceStub:
        stub = self._stubs.get(peer_id)
        if stub is None:
            raise TransportError(f"no channel to {peer_id!r}")
        return stub

    async def _call(self, peer_id: str, method_name: str, request, timeout: float):  # noqa: ANN001, ANN202
        try:
            response = await getattr(self._stub(peer_id), method_name)(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            self._note_failure(peer_id)
            raise TransportError(f"{e.code().name}: {e.details()}") from None
        self._failing_since.pop(peer_id, None)
        return response

    async def _stream_request(self, peer_id: str, request: pb.PeerStreamRequest,
                              timeout: float) -> pb.PeerStreamResponse:
        link = self._link(peer_id)
        if link is not None:
            return await self._link_request(peer_id, link, request, timeout)
        self.requests_by_path["stream"] += 1
        stream = self._streams.get(peer_id)
        if stream is None:
            stream = self._streams[peer_id] = RequestStream(self._stub(peer_id).PeerStream(),
                                                            self._forget(self._streams, peer_id))
        try:
            response = await stream.request(request, timeout)
        except StreamFailure as failure:
            if failure.code == grpc.StatusCode.UNIMPLEMENTED:
                self._unary_until[peer_id] = time.monotonic() + UNARY_FALLBACK_S
            else:
                self._note_failure(peer_id)
            raise TransportError(str(failure)) from None
        self._failing_since.pop(peer_id, None)
        return response

    # ------------------------------------------------------------ peer links
    def _learn_link(self, peer_id: str, port: int) -> None:
        """A heartbeat answer named the peer's link port (0: it has none)."""
        if self._link_ports.get(peer_id, 0) == port:
            return
        if port:
            self._link_ports[peer_id] = port
        else:
            self._link_ports.pop(peer_id, None)
        self._drop_link(peer_id, "the peer's link port changed")

    def _link_address(self, peer_id: str) -> str | None:
        """Where to dial the peer's link, or None: it has none (or it is routed
        around)."""
        port = self._link_ports.get(peer_id)
        if not port:
            return None
        address = self._addresses.get(peer_id, "")
        link = f"{address.rpartition(':')[0]}:{port}"
        dial = self._dial(link)
        if dial == link and self._dial(address) != address:
            # The peer's gRPC address is routed (through a proxy) and its link
            # is not: bypassing the route would bypass what it is there for.
            return None
        return dial

    def _link(self, peer_id: str) -> peer_link.PeerLink | None:
        """The peer's open link, or None: use PeerStream for this request. A
        link is dialed in the background (never while a request waits, so a
        link that cannot be reached costs no request more than PeerStream's
        time), and once open carries every request after."""
        link = self._links.get(peer_id)
        if link is not None or not self._dialer.may_dial(peer_id):
            return link
        address = self._link_address(peer_id)
        if address is None:
            return None
        host = self._addresses.get(peer_id, "").rpartition(":")[0].strip("[]")
        self._dialer.dial(peer_id, peer_id, address, lambda on_broken: peer_link.open_link(
            address, host, self._group, self._self_id, self._signing, self._link_context, LINK_DIAL_TIMEOUT_S,
            on_broken), lambda: self._link_address(peer_id) == address)
        return None

    async def _link_request(self, peer_id: str, link: peer_link.PeerLink, request: pb.PeerStreamRequest,
                            timeout: float) -> pb.PeerStreamResponse:
        self.requests_by_path["link"] += 1
        try:
            response = await link.request(request, timeout)
        except StreamFailure as failure:
            raise TransportError(f"peer link: {failure}") from None
        self._failing_since.pop(peer_id, None)
        return response

    @staticmethod
    def _forget(table: dict[str, Any], peer_id: str) -> Callable[[Any], None]:
        """A stream's or link's on_broken callback: it leaves `table`, unless
        already replaced there."""
        def forget(broken: Any) -> None:
            if table.get(peer_id) is broken:
                del table[peer_id]
        return forget

    @staticmethod
    def _drop(table: dict[str, Any], peer_id: str, why: str) -> None:
        held = table.pop(peer_id, None)
        if held is not None:
            held.close(why)

    def _drop_link(self, peer_id: str, why: str) -> None:
        self._dialer.drop(peer_id, why)

    def _drop_stream(self, peer_id: str, why: str) -> None:
        self._drop(self._streams, peer_id, why)

    def _note_failure(self, peer_id: str) -> None:
        now = time.monotonic()
        since = self._failing_since.setdefault(peer_id, now)
        if now - since >= RENEW_FAILING_CHANNEL_AFTER_S:
            # Calls still in flight on the old channel get a grace period to
            # finish or fail there; then it is closed (a peer down for hours
            # must not leave a channel behind every 5 s).
            self._retire(self._channels[peer_id])
            self._open(peer_id)
            self._failing_since[peer_id] = now

    async def vote(self, peer_id: str, request: pb.VoteRequest, timeout: float) -> pb.VoteResponse:
        return await self._call(peer_id, "Vote", request, timeout)

    async def heartbeat(self, peer_id: str, request: pb.HeartBeatRequest, timeout: float) -> pb.HeartBeatResponse:
        if self._unary_only(peer_id):
            self.requests_by_path["unary"] += 1
            answer = await self._call(peer_id, "HeartBeat", request, timeout)
        else:
            response = await self._stream_request(peer_id, pb.PeerStreamRequest(heartbeat=request), timeout)
            answer = self._body(response, "heartbeat")
        self._learn_link(peer_id, answer.peer_link_port)
        return answer

    async def push(self, peer_id: str, request: pb.PushEntryRequest, timeout: float) -> pb.PushEntryResponse:
        if self._unary_only(peer_id):
            self.requests_by_path["unary"] += 1
            return await self._call(peer_id, "Push", request, timeout)
        response = await self._stream_request(peer_id, pb.PeerStreamRequest(push=request), timeout)
        return self._body(response, "push")

    def _unary_only(self, peer_id: str) -> bool:
        until = self._unary_until.get(peer_id)
        if until is not None and time.monotonic() >= until:
            del self._unary_until[peer_id]
            return False
        return until is not None

    @staticmethod
    def _body(response: pb.PeerStreamResponse, kind: str):  # noqa: ANN205 - the answer of that kind
        if response.WhichOneof("body") != kind:
            raise TransportError(f"answer {response.id} to a {kind} carries {response.WhichOneof('body')}")
        return getattr(response, kind)

    async def leadership_transfer(self, peer_id: str, request: pb.LeadershipTransferRequest,
                                  timeout: float) -> pb.LeadershipTransferResponse:
        return await self._call(peer_id, "LeadershipTransfer", request, timeout)

    def update_peers(self, addresses: dict[str, str]) -> None:
        """The membership changed: open channels to new peers (or to a peer at
        a new address), retire those to peers that left."""
        for peer_id, address in addresses.items():
            if not address or self._addresses.get(peer_id) == address and peer_id in self._channels:
                continue
            old = self._channels.pop(peer_id, None)
            if old is not None:
                self._retire(old)
            self._addresses[peer_id] = address
            self._drop_link(peer_id, "the peer moved")
            self._link_ports.pop(peer_id, None)
            self._open(peer_id)
        for peer_id in [p for p in self._channels if p not in addresses]:
            self._drop_stream(peer_id, "the peer left the group")
            self._drop_link(peer_id, "the peer left the group")
            self._link_ports.pop(peer_id, None)
            self._retire(self._channels.pop(peer_id))
            self._stubs.pop(peer_id, None)
            self._addresses.pop(peer_id, None)
            self._failing_since.pop(peer_id, None)

    def _retire(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(grace=RETIRED_CHANNEL_GRACE_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @property
    def open_links(self) -> int:
        return len(self._links)

    @property
    def open_channels(self) -> int:
        """Channels not yet closed (the current ones and those closing)."""
        return len(self._channels) + len(self._closing)

    async def close(self) -> None:
        for peer_id in list(self._streams):
            self._drop_stream(peer_id, "the transport was closed")
        await self._dialer.close("the transport was closed")
        for channel in self._channels.values():
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
