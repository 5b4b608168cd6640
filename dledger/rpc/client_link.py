"""Client links: a log client's appends to the leader as frames on a TCP
(or TLS) connection of their own (dledger/rpc/link.py) instead of messages
on a gRPC AppendStream: one message each way on an open gRPC stream costs
about twice what it costs on a framed connection between the same two
processes (`python -m bench.grpc_pingpong`), and an append at a time waits
for both.

The frames are exactly AppendStream's messages (AppendStreamRequest and
AppendStreamResponse), answered by the same code (append_stream.py), so a
link and a stream give the same answers, refusals and NOT_LEADER redirects.
Every AppendStream answer names the node's link port (`link_port`); a
client dials it in the background on the host of the address it dialled
and moves its appends there once the handshake is done; until then, and
for a while after a dial fails, they go on AppendStream.

Who may open one is what may open an AppendStream: with auth on, the hello
names a user and proves its secret (an HMAC of the listener's nonce keyed
by it), and the user needs Pub on the Cluster from its source address;
with auth off, anyone who reaches the port. The check is made once, when
the link opens, as gRPC's is when a stream opens. With TLS for clients the
link is TLS with the node's certificate (no client certificate, as on the
client gRPC port).

The same port serves other kinds of link that the layers above register
(`services`, named by the hello's `service`): the broker's messaging link
(broker/messaging_link.py) carries our broker client's sends, receives and
acks. Who may open one of those is the service's own (the credential check
is told the hello, which names it).
"""
from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Callable

from dledger.rpc.append_stream import answer_append
from dledger.rpc.link import Link, LinkHandler, LinkServer, dial
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

# (hello, nonce, source IP) -> why the dialer is refused ("" when it is not):
# the node's credentials and ACL check (cluster/security/client_link_guard.py).
CredentialCheck = Callable[[pb.PeerLinkHello, bytes, str], str]
# (hello, peer as gRPC names it) -> what answers an accepted link of a service.
ServiceHandler = Callable[[pb.PeerLinkHello, str], LinkHandler[Any, Any]]


class ClientLink(Link[pb.AppendStreamRequest, pb.AppendStreamResponse]):
    """A client's end of its link to one node."""

    response_type = pb.AppendStreamResponse


async def open_client_link(address: str, server_hostname: str, group: str, client_id: str,
                           signing: tuple[str, str] | None, context: ssl.SSLContext | None, timeout: float,
                           on_broken: Callable[[ClientLink], None]) -> ClientLink:
    """Dial the client link at `address` (HOST:PORT) as `client_id`, with
    `signing` = (user, secret) when the client has credentials. Raises
    OSError (cannot connect), TimeoutError, LinkRefused."""
    return await dial(ClientLink(on_broken), address, server_hostname, group, client_id, signing, context,
                      timeout)


class ClientLinkServer(LinkServer[pb.AppendStreamRequest, pb.AppendStreamResponse]):
    """A node's end: every node serves one (a follower answers NOT_LEADER,
    as on AppendStream)."""

    kind = "client link"

    def __init__(self, server: DLedgerServer, check: CredentialCheck | None,
                 context: ssl.SSLContext | None) -> None:
        super().__init__(context)
        self.dledger = server
        self.check = check   # None: auth is off
        self.appends = 0     # AppendStream messages answered on links (metrics, tests)
        # Other kinds of link this port serves, by PeerLinkHello.service.
        self.services: dict[str, ServiceHandler] = {}

    def group_and_id(self) -> tuple[str, str]:
        return self.dledger.config.group, self.dledger.config.self_id

    def refusal(self, hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> str:
        group = self.dledger.config.group
        if hello.service and hello.service not in self.services:
            return f"this node serves no {hello.service!r} links"
        if hello.group != group:
            return f"this node belongs to group {group!r}, not {hello.group!r}"
        return self.check(hello, nonce, source_ip) if self.check is not None else ""

    def handler_for(self, hello: pb.PeerLinkHello, peer: str) -> LinkHandler[Any, Any]:
        return self.services[hello.service](hello, peer) if hello.service else self

    def parse(self, body: bytes) -> pb.AppendStreamRequest:
        request = pb.AppendStreamRequest.FromString(body)
        if not request.HasField("append"):
            raise ValueError(f"request {request.id} carries no append")
        return request

    async def respond(self, request: pb.AppendStreamRequest) -> pb.AppendStreamResponse:
        self.appends += 1
        return await answer_append(self.dledger, request)


def client_tls_context(ca: bytes) -> ssl.SSLContext:
    """A client's TLS to a node's link: trust the CA it trusts for gRPC."""
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode())


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A node's link for clients: its certificate, none asked of the client."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context
