"""Peer links: a leader's pushes and heartbeats to a follower as
length-prefixed protobuf frames on one plain TCP (or TLS) connection,
instead of messages on a gRPC PeerStream.

Why: a message on an open gRPC stream still costs a write by grpcio's C
core, a wake-up of the receiving process's poller thread and a hand-off to
its event loop: about 350 µs a hop in a busy cluster on this kind of
machine, four hops in every commit (docs/performance.md, "Where one append
at a time waits"). An asyncio connection is read by the event loop itself,
one wake-up per read. gRPC stays for everything else (votes, clients, the
RocketMQ protocol, admin); a node that offers no link (an older version,
`peer_link_enabled = false`) is reached over PeerStream as before.

The frames are exactly PeerStream's messages (PeerStreamRequest and
PeerStreamResponse, correlated by id), each after a 4-byte big-endian
length. Semantics are RequestStream's (dledger/rpc/request_stream.py):
several requests in flight, answers in any order; an answer overdue, a
connection cut or a malformed frame gives the whole link up and fails
every request waiting on it with StreamFailure, and the next request
dials a new one (the dispatcher backs off and goes back to COMPARE).

The handshake (proto: PeerLinkHello, PeerLinkChallenge, PeerLinkWelcome):
the dialer opens with a hello naming its group and id (the dialer speaks
first, as on any TCP protocol a proxy may sit in front of); the listener
answers with a random nonce, its group and id; the dialer checks the group
and sends its hello again with, when auth is on, an HMAC-SHA256 of the nonce
keyed by the bootstrap super user's secret (what every member holds; the
gRPC peer calls are signed with it); the listener accepts or names its
reason and closes. With the cluster CA configured the connection is mutual
TLS against that CA, as the gRPC peer port is.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import ssl
import struct
from typing import TYPE_CHECKING, Callable

from dledger.rpc.peer_stream import answer_peer_request
from dledger.rpc.request_stream import AnsweredById
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

log = logging.getLogger(__name__)

LENGTH = struct.Struct(">I")
# A push carries up to max_push_batch_bytes; the gRPC peer channel allows the same.
MAX_FRAME_BYTES = 64 << 20
NONCE_BYTES = 16
# A dialer that has not said hello by then is dropped (a port scanner, a
# process that is not a member).
HELLO_TIMEOUT_S = 5.0


class FrameError(Exception):
    """The byte stream is not a sequence of frames (too large a length)."""


class LinkRefused(Exception):
    """The listener did not accept this node (another group, a wrong proof)."""


def frame(message: object) -> bytes:
    body = message.SerializeToString()  # type: ignore[attr-defined]
    return LENGTH.pack(len(body)) + body


class FrameReader:
    """Cuts what a connection delivers into frames' bodies."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_bytes

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        start, end = 0, len(buffer)
        while end - start >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buffer, start)
            if length > self._max:
                raise FrameError(f"a frame of {length} bytes (at most {self._max})")
            if end - start - LENGTH.size < length:
                break
            start += LENGTH.size
            bodies.append(bytes(buffer[start:start + length]))
            start += length
        if start:
            del buffer[:start]
        return bodies


def proof(secret: str, nonce: bytes, group: str, sender_id: str) -> bytes:
    message = nonce + group.encode() + b"\0" + sender_id.encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


# ------------------------------------------------------------------ dialer
class PeerLink(AnsweredById[pb.PeerStreamRequest, pb.PeerStreamResponse]):
    """The leader's end of one link: `request` sends a PeerStreamRequest and
    waits for its answer (AnsweredById: ids, timeouts, giving up)."""

    def __init__(self, on_broken: Callable[["PeerLink"], None]) -> None:
        super().__init__(on_broken)
        self._transport: asyncio.Transport | None = None

    async def _send(self, message: pb.PeerStreamRequest) -> None:
        # Buffered by the transport when the socket is full: bounded by the
        # dispatcher's pushes in flight (max_inflight_pushes_per_peer).
        assert self._transport is not None
        self._transport.write(frame(message))

    def answered(self, body: bytes) -> None:
        self._answered(pb.PeerStreamResponse.FromString(body))

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class _DialerProtocol(asyncio.Protocol):
    """Frames in: the challenge, the welcome, then answers for the link."""

    def __init__(self, link: PeerLink) -> None:
        self.link = link
        self.reader = FrameReader()
        self.handshake: asyncio.Queue[bytes] = asyncio.Queue()
        self.ready = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.reader.feed(data)
            for body in bodies:
                if self.ready:
                    self.link.answered(body)
                else:
                    self.handshake.put_nowait(body)
        except Exception as error:  # a malformed frame: the link cannot be trusted further
            self.link.close(f"a malformed frame from the peer: {type(error).__name__}: {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.close(f"the connection was lost ({exc})" if exc else "the peer closed the link")
        self.handshake.put_nowait(b"")   # wakes a handshake still waiting


async def open_link(address: str, server_hostname: str, group: str, sender_id: str,
                    signing: tuple[str, str] | None, context: ssl.SSLContext | None, timeout: float,
                    on_broken: Callable[[PeerLink], None]) -> PeerLink:
    """Dial `address` (HOST:PORT), shake hands, return the link. Raises
    OSError (cannot connect), TimeoutError, LinkRefused."""
    loop = asyncio.get_running_loop()
    host, _, port = address.rpartition(":")
    link = PeerLink(on_broken)
    protocol = _DialerProtocol(link)
    try:
        async with asyncio.timeout(timeout):
            await loop.create_connection(lambda: protocol, host, int(port), ssl=context,
                                         server_hostname=server_hostname if context is not None else None)
            assert link._transport is not None
            link._transport.write(frame(pb.PeerLinkHello(group=group, sender_id=sender_id)))
            challenge = pb.PeerLinkChallenge.FromString(await _handshake_frame(protocol))
            if challenge.group != group:
                raise LinkRefused(f"{address} is node {challenge.node_id!r} of group {challenge.group!r}, "
                                  f"not of {group!r}")
            hello = pb.PeerLinkHello(group=group, sender_id=sender_id)
            if signing is not None:
                hello.user = signing[0]
                hello.proof = proof(signing[1], challenge.nonce, group, sender_id)
            link._transport.write(frame(hello))
            welcome = pb.PeerLinkWelcome.FromString(await _handshake_frame(protocol))
            if welcome.refused:
                raise LinkRefused(f"{address} refused the link: {welcome.refused}")
            protocol.ready = True
    except BaseException:
        link.close("the handshake did not complete")
        raise
    return link


async def _handshake_frame(protocol: _DialerProtocol) -> bytes:
    body = await protocol.handshake.get()
    if protocol.link.broken is not None:
        raise ConnectionError(str(protocol.link.broken))
    return body


# ---------------------------------------------------------------- listener
class PeerLinkServer:
    """A follower's end: accepts links from members, answers each request in
    its own task (in arrival order, as PeerStream does), writes the answers
    back on the link."""

    def __init__(self, server: DLedgerServer, auth: tuple[str, str] | None,
                 context: ssl.SSLContext | None) -> None:
        self.dledger = server
        self.auth = auth   # (super user, secret) when auth is on: hellos must prove it
        self.context = context
        self._server: asyncio.AbstractServer | None = None
        self.connections: set[_ListenerProtocol] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on HOST:PORT (0: any free port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ListenerProtocol(self), host, port, ssl=self.context,
                                                reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            connection.drop()
        await self._server.wait_closed()

    def refusal(self, hello: pb.PeerLinkHello, nonce: bytes) -> str:
        """Why `hello` is not accepted ("" when it is)."""
        config = self.dledger.config
        if hello.group != config.group:
            return f"this node belongs to group {config.group!r}, not {hello.group!r}"
        if self.auth is not None:
            user, secret = self.auth
            if hello.user != user or not hmac.compare_digest(hello.proof,
                                                             proof(secret, nonce, hello.group, hello.sender_id)):
                return "the hello carries no valid proof of the members' credentials"
        return ""


class _ListenerProtocol(asyncio.Protocol):
    def __init__(self, owner: PeerLinkServer) -> None:
        self.owner = owner
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.nonce = os.urandom(NONCE_BYTES)
        self.peer = ""
        self.challenged = False   # the opening hello has been answered with the nonce
        self.ready = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.owner.connections.add(self)
        self.hello_timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT_S, self.drop)

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.reader.feed(data)
            for body in bodies:
                if self.ready:
                    self._answer(pb.PeerStreamRequest.FromString(body))
                elif not self.challenged:
                    self._challenge(pb.PeerLinkHello.FromString(body))
                else:
                    self._greet(pb.PeerLinkHello.FromString(body))
        except Exception as error:  # malformed: drop the link, the leader dials again
            log.warning("peer link from %s dropped: a malformed frame (%s: %s)",
                        self.peer or "an unknown node", type(error).__name__, error)
            self.drop()

    def _challenge(self, opening: pb.PeerLinkHello) -> None:
        config = self.owner.dledger.config
        assert self.transport is not None
        self.transport.write(frame(pb.PeerLinkChallenge(nonce=self.nonce, group=config.group,
                                                        node_id=config.self_id)))
        self.challenged = True

    def _greet(self, hello: pb.PeerLinkHello) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        refused = self.owner.refusal(hello, self.nonce)
        assert self.transport is not None
        self.transport.write(frame(pb.PeerLinkWelcome(refused=refused)))
        if refused:
            log.warning("peer link from %r refused: %s", hello.sender_id, refused)
            self.transport.close()   # after the welcome is written
            return
        self.peer, self.ready = hello.sender_id, True

    def _answer(self, request: pb.PeerStreamRequest) -> None:
        if request.WhichOneof("body") is None:
            raise ValueError(f"request {request.id} carries neither a push nor a heartbeat")
        task = asyncio.get_running_loop().create_task(self._answer_one(request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer_one(self, request: pb.PeerStreamRequest) -> None:
        response = await answer_peer_request(self.owner.dledger, request)
        transport = self.transport
        if response is not None and transport is not None and not transport.is_closing():
            transport.write(frame(response))

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        self.owner.connections.discard(self)
        # As gRPC cancels a handler whose call ended: the leader has given
        # these requests up (it dials again and goes back to COMPARE).
        for task in list(self.tasks):
            task.cancel()
        self.transport = None


# ------------------------------------------------------------------- TLS
def client_context(cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext:
    """Mutual TLS to a member: trust only the cluster CA, present this node's
    certificate, check the peer's name (its peer address's host)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.load_cert_chain(cert_file, key_file)
    return context


def server_context(cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext:
    """Members only: a client certificate signed by the cluster CA is required."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_file)
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = ssl.CERT_REQUIRED
    return context
