"""Peer links: a leader's pushes and heartbeats to a follower as frames on
one TCP (or TLS) connection (dledger/rpc/link.py), instead of messages on a
gRPC PeerStream. gRPC stays for everything else (votes, clients, the
RocketMQ protocol, admin); a node that offers no link (an older version,
`peer_link_enabled = false`) is reached over PeerStream as before.

The frames are exactly PeerStream's messages (PeerStreamRequest and
PeerStreamResponse). In the handshake the dialer names itself by its node
id; with auth on its proof is keyed by the bootstrap super user's secret
(what every member holds; the gRPC peer calls are signed with it). With the
cluster CA configured the connection is mutual TLS against that CA, as the
gRPC peer port is.
"""
from __future__ import annotations

import hmac
import ssl
from typing import TYPE_CHECKING, Callable

from dledger.rpc.link import (LENGTH, FrameError, FrameReader, Link, LinkRefused, LinkServer, dial, frame,
                              proof)
from dledger.rpc.peer_stream import answer_peer_request
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

# What tests and the transport take from here with the peer link's names.
__all__ = ["LENGTH", "FrameError", "FrameReader", "LinkRefused", "PeerLink", "PeerLinkServer", "frame",
           "open_link", "client_context", "server_context"]


class PeerLink(Link[pb.PeerStreamRequest, pb.PeerStreamResponse]):
    """The leader's end of one link to a follower."""

    response_type = pb.PeerStreamResponse


async def open_link(address: str, server_hostname: str, group: str, sender_id: str,
                    signing: tuple[str, str] | None, context: ssl.SSLContext | None, timeout: float,
                    on_broken: Callable[[PeerLink], None]) -> PeerLink:
    """Dial a follower's link at `address` (HOST:PORT). Raises OSError
    (cannot connect), TimeoutError, LinkRefused."""
    return await dial(PeerLink(on_broken), address, server_hostname, group, sender_id, signing, context,
                      timeout)


class PeerLinkServer(LinkServer[pb.PeerStreamRequest, pb.PeerStreamResponse]):
    """A follower's end: accepts links from its group's members."""

    kind = "peer link"

    def __init__(self, server: DLedgerServer, auth: tuple[str, str] | None,
                 context: ssl.SSLContext | None) -> None:
        super().__init__(context)
        self.dledger = server
        self.auth = auth   # (super user, secret) when auth is on: hellos must prove it

    def group_and_id(self) -> tuple[str, str]:
        return self.dledger.config.group, self.dledger.config.self_id

    def refusal(self, hello: pb.PeerLinkHello, nonce: bytes, source_ip: str = "") -> str:
        config = self.dledger.config
        if hello.group != config.group:
            return f"this node belongs to group {config.group!r}, not {hello.group!r}"
        if self.auth is not None:
            user, secret = self.auth
            if hello.user != user or not hmac.compare_digest(hello.proof,
                                                             proof(secret, nonce, hello.group, hello.sender_id)):
                return "the hello carries no valid proof of the members' credentials"
        return ""

    def parse(self, body: bytes) -> pb.PeerStreamRequest:
        request = pb.PeerStreamRequest.FromString(body)
        if request.WhichOneof("body") is None:
            raise ValueError(f"request {request.id} carries neither a push nor a heartbeat")
        return request

    async def respond(self, request: pb.PeerStreamRequest) -> pb.PeerStreamResponse | None:
        return await answer_peer_request(self.dledger, request)


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
