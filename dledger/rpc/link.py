"""Links: requests and their answers as length-prefixed protobuf frames on
one plain TCP (or TLS) connection, read by the event loop itself.

Why: a message on an open gRPC stream still costs a write by grpcio's C
core, a wake-up of the receiving process's poller thread and a hand-off to
its event loop: about 350 µs a hop in a busy cluster on this kind of
machine (docs/performance.md). An asyncio connection is read by the event
loop itself, one wake-up per read. Two kinds of link ride this module: a
leader's pushes and heartbeats to a follower (dledger/rpc/peer_link.py) and
a log client's appends to the leader (dledger/rpc/client_link.py).

Each frame is a protobuf message after a 4-byte big-endian length.
Semantics are RequestStream's (dledger/rpc/request_stream.py): several
requests in flight, answers correlated by id in any order; an answer
overdue, a connection cut or a malformed frame gives the whole link up and
fails every request waiting on it with StreamFailure, and the owner dials a
new one.

The handshake (proto: PeerLinkHello, PeerLinkChallenge, PeerLinkWelcome):
the dialer opens with a hello naming its group and id (the dialer speaks
first, as on any TCP protocol a proxy may sit in front of); the listener
answers with a random nonce, its group and id; the dialer checks the group
and sends its hello again, with credentials when it has them: a user and an
HMAC-SHA256 of the nonce, the group and its id keyed by that user's secret;
the listener accepts or names its reason and closes. What a listener
accepts is its own (LinkServer.refusal). An owner keeps its links in a
LinkDialer: dialed in the background, resting after a failed dial.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import ssl
import struct
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Awaitable, Callable, Generic, Hashable, Protocol, TypeVar

from dledger.rpc.request_stream import AnsweredById
from rpcgen import dledger_pb2 as pb

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")

LENGTH = struct.Struct(">I")
# A push carries up to max_push_batch_bytes; the gRPC peer channel allows the same.
MAX_FRAME_BYTES = 64 << 20
NONCE_BYTES = 16
# A dialer that has not said hello by then is dropped (a port scanner, a
# process that is not a member or a client).
HELLO_TIMEOUT_S = 5.0
# Requests one connection may have waiting for their answers before the
# listener stops reading it (TCP's flow control then holds the dialer back),
# as HTTP/2 flow control holds back a gRPC stream's sender. Far above what a
# leader (max_inflight_pushes_per_peer) or a client (4 appends) keeps in flight.
MAX_REQUESTS_IN_FLIGHT = 256
# A link that cannot be dialed (the port filtered, the node down) leaves its
# owner on its gRPC stream this long before it is dialed again; a refused one
# (another group, wrong credentials: a configuration error) longer.
LINK_RETRY_S = 5.0
LINK_REFUSED_RETRY_S = 60.0
LINK_DIAL_TIMEOUT_S = 2.0


class FrameError(Exception):
    """The byte stream is not a sequence of frames (too large a length)."""


class LinkRefused(Exception):
    """The listener did not accept this dialer (another group, a wrong proof)."""


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
class Link(AnsweredById[Req, Resp]):
    """The dialer's end of one link: `request` sends a message and waits for
    its answer (AnsweredById: ids, timeouts, giving up). A subclass names the
    answers' type."""

    response_type: Any = None

    def __init__(self, on_broken: Callable[[Any], None]) -> None:
        super().__init__(on_broken)
        self._transport: asyncio.Transport | None = None

    async def _send(self, message: Req) -> None:
        # Buffered by the transport when the socket is full: bounded by the
        # owner's requests in flight.
        assert self._transport is not None
        self._transport.write(frame(message))

    def answered(self, body: bytes) -> None:
        self._answered(self.response_type.FromString(body))

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class _DialerProtocol(asyncio.Protocol):
    """Frames in: the challenge, the welcome, then answers for the link."""

    def __init__(self, link: Link[Any, Any]) -> None:
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
            self.link.close(f"a malformed frame from the listener: {type(error).__name__}: {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.close(f"the connection was lost ({exc})" if exc else "the listener closed the link")
        self.handshake.put_nowait(b"")   # wakes a handshake still waiting


LinkT = TypeVar("LinkT", bound=Link[Any, Any])


async def dial(link: LinkT, address: str, server_hostname: str, group: str, sender_id: str,
               signing: tuple[str, str] | None, context: ssl.SSLContext | None, timeout: float,
               service: str = "") -> LinkT:
    """Dial `address` (HOST:PORT) for `link`, shake hands, return the link.
    `signing`: (user, secret) that proves who dials; `service`: what the
    link carries, where a listener serves several (PeerLinkHello.service).
    Raises OSError (cannot connect), TimeoutError, LinkRefused."""
    loop = asyncio.get_running_loop()
    host, _, port = address.rpartition(":")
    protocol = _DialerProtocol(link)
    try:
        async with asyncio.timeout(timeout):
            await loop.create_connection(lambda: protocol, host.strip("[]"), int(port), ssl=context,
                                         server_hostname=server_hostname if context is not None else None)
            assert link._transport is not None
            link._transport.write(frame(pb.PeerLinkHello(group=group, sender_id=sender_id)))
            challenge = pb.PeerLinkChallenge.FromString(await _handshake_frame(protocol))
            if challenge.group != group:
                raise LinkRefused(f"{address} is node {challenge.node_id!r} of group {challenge.group!r}, "
                                  f"not of {group!r}")
            hello = pb.PeerLinkHello(group=group, sender_id=sender_id, service=service)
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


Key = TypeVar("Key", bound=Hashable)


class LinkDialer(Generic[Key, LinkT]):
    """An owner's open links, one per key (a peer, a server), each dialed in
    the background: never while a request waits, so a link that cannot be
    reached costs no request more than the gRPC stream's time. A failed dial
    rests its key `retry_s`, a refused one `refused_retry_s`."""

    def __init__(self, kind: str, fallback: str, retry_s: float, refused_retry_s: float) -> None:
        self.kind, self.fallback = kind, fallback   # for log lines: "peer link", "PeerStream"
        self.retry_s, self.refused_retry_s = retry_s, refused_retry_s
        self.links: dict[Key, LinkT] = {}
        self.dialing: dict[Key, asyncio.Task[LinkT]] = {}
        self.off_until: dict[Key, float] = {}
        # Dials by outcome: opened, failed (cannot connect, no answer),
        # refused (another group, wrong credentials: a configuration error).
        self.dials = {"opened": 0, "failed": 0, "refused": 0}

    def may_dial(self, key: Key) -> bool:
        """No link for `key`, none being dialed, and not resting."""
        return key not in self.links and key not in self.dialing and \
            time.monotonic() >= self.off_until.get(key, 0.0)

    def dial(self, key: Key, name: str, address: str, opener: Callable[[Callable[[LinkT], None]], Awaitable[LinkT]],
             still_wanted: Callable[[], bool]) -> None:
        """Start `opener(on_broken)` for `key` (after may_dial); the link
        it opens is kept if `still_wanted()` then."""
        task = asyncio.get_running_loop().create_task(opener(self._forget(key)))
        self.dialing[key] = task
        task.add_done_callback(lambda done: self._dialed(key, name, address, done, still_wanted))

    def _dialed(self, key: Key, name: str, address: str, task: asyncio.Task[LinkT],
                still_wanted: Callable[[], bool]) -> None:
        if self.dialing.get(key) is task:
            del self.dialing[key]
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            link = task.result()
            if link.broken is None and still_wanted():
                self.links[key] = link
                self.dials["opened"] += 1
                log.info("%s to %s at %s", self.kind, name, address)
            else:
                link.close("no longer wanted once dialed")
            return
        refused = isinstance(error, LinkRefused)
        self.dials["refused" if refused else "failed"] += 1
        retry_s = self.refused_retry_s if refused else self.retry_s
        self.off_until[key] = time.monotonic() + retry_s
        (log.warning if refused else log.info)("%s to %s at %s: %s; %s for %.0fs", self.kind, name, address,
                                               str(error) or type(error).__name__, self.fallback, retry_s)

    def _forget(self, key: Key) -> Callable[[LinkT], None]:
        """The link's on_broken: it leaves `links`, unless already replaced."""
        def forget(broken: LinkT) -> None:
            if self.links.get(key) is broken:
                del self.links[key]
        return forget

    def drop(self, key: Key, why: str) -> None:
        link = self.links.pop(key, None)
        if link is not None:
            link.close(why)

    async def close(self, why: str) -> None:
        """Close every link and stop every dial."""
        for key in list(self.links):
            self.drop(key, why)
        dials = list(self.dialing.values())
        for dialing in dials:
            dialing.cancel()
        await asyncio.gather(*dials, return_exceptions=True)


# ---------------------------------------------------------------- listener
class LinkHandler(Protocol[Req, Resp]):
    """What answers the requests of one accepted link."""

    def parse(self, body: bytes) -> Req:
        """A request frame's message; raises on one that is malformed (the
        link is dropped)."""

    async def respond(self, request: Req) -> Resp | None:
        """The answer to write back (None: none)."""


class LinkServer(ABC, Generic[Req, Resp]):
    """The listening end: accepts links whose hello `refusal` accepts, answers
    each request in its own task (in arrival order, as a gRPC stream's
    servicer does), writes the answers back on the link."""

    kind = "link"   # for log lines: "peer link", "client link"

    def __init__(self, context: ssl.SSLContext | None) -> None:
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

    @abstractmethod
    def refusal(self, hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> str:
        """Why `hello` is not accepted ("" when it is)."""

    @abstractmethod
    def parse(self, body: bytes) -> Req:
        """A request frame's message; raises on one that is malformed (the
        link is dropped)."""

    @abstractmethod
    async def respond(self, request: Req) -> Resp | None:
        """The answer to write back (None: none)."""

    @abstractmethod
    def group_and_id(self) -> tuple[str, str]:
        """What the challenge names: this node's group and id."""

    def handler_for(self, hello: pb.PeerLinkHello, peer: str) -> LinkHandler[Any, Any]:
        """What answers an accepted link's requests (`peer`: its source as
        gRPC names one, `ipv4:HOST:PORT`): this server itself, unless it
        serves several kinds of link."""
        return self


class _ListenerProtocol(asyncio.Protocol):
    def __init__(self, owner: LinkServer[Any, Any]) -> None:
        self.owner = owner
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.nonce = os.urandom(NONCE_BYTES)
        self.dialer = ""
        self.challenged = False   # the opening hello has been answered with the nonce
        self.ready = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.backlog: deque[bytes] = deque()   # requests read but not started (too many waiting)
        self.handler: LinkHandler[Any, Any] = owner   # what answers, once the hello is accepted
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
                    self.backlog.append(body)
                elif not self.challenged:
                    self._challenge(pb.PeerLinkHello.FromString(body))
                else:
                    self._greet(pb.PeerLinkHello.FromString(body))
            self._start_backlog()
        except Exception as error:  # malformed: drop the link, the dialer dials again
            self._malformed(error)

    def _malformed(self, error: Exception) -> None:
        log.warning("%s from %s dropped: a malformed frame (%s: %s)", self.owner.kind,
                    self.dialer or "an unknown dialer", type(error).__name__, error)
        self.drop()

    def _challenge(self, opening: pb.PeerLinkHello) -> None:
        group, node_id = self.owner.group_and_id()
        assert self.transport is not None
        self.transport.write(frame(pb.PeerLinkChallenge(nonce=self.nonce, group=group, node_id=node_id)))
        self.challenged = True

    def _greet(self, hello: pb.PeerLinkHello) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        refused = self.owner.refusal(hello, self.nonce, str(peer[0]) if peer else "")
        self.transport.write(frame(pb.PeerLinkWelcome(refused=refused)))
        if refused:
            log.warning("%s from %r refused: %s", self.owner.kind, hello.sender_id, refused)
            self.transport.close()   # after the welcome is written
            return
        self.handler = self.owner.handler_for(hello, _grpc_peer(peer))
        self.dialer, self.ready = hello.sender_id, True

    def _start_backlog(self) -> None:
        """Answer what was read, in order, while fewer than
        MAX_REQUESTS_IN_FLIGHT wait; with that many waiting, stop reading the
        connection until half are answered."""
        loop = asyncio.get_running_loop()
        while self.backlog and len(self.tasks) < MAX_REQUESTS_IN_FLIGHT:
            task = loop.create_task(self._answer_one(self.handler.parse(self.backlog.popleft())))
            self.tasks.add(task)
            task.add_done_callback(self._answered)
        if self.transport is None or self.transport.is_closing():
            return
        if len(self.tasks) >= MAX_REQUESTS_IN_FLIGHT:
            self.transport.pause_reading()
        elif not self.backlog and len(self.tasks) <= MAX_REQUESTS_IN_FLIGHT // 2:
            self.transport.resume_reading()   # a no-op when not paused

    def _answered(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if self.backlog or len(self.tasks) == MAX_REQUESTS_IN_FLIGHT // 2:
            try:
                self._start_backlog()
            except Exception as error:   # a malformed request met late: as in data_received
                self._malformed(error)

    async def _answer_one(self, request: Any) -> None:
        response = await self.handler.respond(request)
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
        # As gRPC cancels a handler whose call ended: the dialer has given
        # these requests up (it dials again and asks again).
        for task in list(self.tasks):
            task.cancel()
        self.transport = None


def _grpc_peer(peer: Any) -> str:
    """A socket's peer name as gRPC's context.peer() gives it."""
    if not peer:
        return ""
    host, port = peer[0], peer[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
