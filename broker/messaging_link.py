"""Messaging links: our broker client's sends, receives and acks as frames on
the node's client link (dledger/rpc/client_link.py) instead of gRPC calls.

Why: a unary gRPC call costs each end several times what a framed message
on an open connection costs (`python -m bench.grpc_pingpong`), and profiles
of a leader under our client's receive-and-ack put grpcio's own per-call
work at about a quarter of its CPU (docs/performance.md). The log client's
appends already ride such a link; this is the same for the messaging calls.

What travels is the relay's vocabulary (proto/pydledger/relay/v1/relay.proto):
each request a RelayedCall (the method, the client's own metadata, the
request serialized, the caller's deadline), each answer a RelayedAnswer, a
server-streaming call's responses (a receive) all in one. A call is run
exactly as it would be arriving on the client gRPC port: the servicer's
handler behind that port's interceptors (namespaces, then authentication
and the ACLs of what the call does, from the signed headers it carries),
with a RelayContext that gives it the client's metadata, its deadline and
the link's peer (broker/relay.py, `answer_call`). So a link answers what
gRPC answers: the same statuses, refusals, forwarding by a follower and
holding through a leader change. A call still running when its deadline
passes, or that its caller withdraws (a frame with `withdrawn` and its id:
the client stopped waiting, say because the leader moved), is cancelled and
not answered, as gRPC cancels the handler of a call its caller gave up: a
send given up on must not store its message after its retry did, a receive
must not lease messages nobody waits for.

Who may open a link: with auth on, a user whose hello proves its secret
(cluster/security/client_link_guard.py); what each call may do is then
checked call by call. Only the messaging service's calls are served.
"""
from __future__ import annotations

import asyncio

import grpc

from broker.namespaces import MESSAGING_PREFIX
from broker.relay import RelayedHandlers, answer_call
from rpcgen import dledger_pb2 as pb
from rpcgen.pydledger.relay.v1 import relay_pb2 as rpb

# PeerLinkHello.service of a messaging link.
SERVICE = "messaging"


class MessagingLinkHandler:
    """Answers the calls of one accepted link."""

    def __init__(self, links: MessagingLinks, peer: str) -> None:
        self._links = links
        self._peer = peer
        self._running: dict[int, asyncio.Task[object]] = {}   # by call id

    def parse(self, body: bytes) -> rpb.RelayedCall:
        return rpb.RelayedCall.FromString(body)

    async def respond(self, call: rpb.RelayedCall) -> rpb.RelayedAnswer | None:
        if call.withdrawn:
            # Frames are answered in tasks started in arrival order: the
            # call's own task has registered itself by now, if it still runs.
            withdrawn = self._running.get(call.id)
            if withdrawn is not None:
                withdrawn.cancel()
            return None
        task = asyncio.current_task()
        assert task is not None
        self._running[call.id] = task
        try:
            return await self._answer(call)   # cancelled when withdrawn: no answer goes out
        finally:
            self._running.pop(call.id, None)

    async def _answer(self, call: rpb.RelayedCall) -> rpb.RelayedAnswer | None:
        self._links.calls += 1
        if not call.method.startswith(MESSAGING_PREFIX):
            return rpb.RelayedAnswer(id=call.id, code=grpc.StatusCode.UNIMPLEMENTED.value[0],
                                     details=f"a messaging link carries {MESSAGING_PREFIX}* calls, not {call.method}")
        try:
            async with asyncio.timeout(call.timeout_s if call.timeout_s > 0 else None):
                return await answer_call(self._links.handlers, call, self._peer, streams=True)
        except TimeoutError:
            return None   # the caller gave up on it (and may have retried)


class MessagingLinks:
    """The messaging service of a node's client link port: registered in
    ClientLinkServer.services under SERVICE."""

    def __init__(self, handlers: RelayedHandlers) -> None:
        self.handlers = handlers
        self.calls = 0   # calls answered on messaging links (metrics, tests)

    def __call__(self, hello: pb.PeerLinkHello, peer: str) -> MessagingLinkHandler:
        return MessagingLinkHandler(self, peer)
