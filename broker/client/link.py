"""The client's messaging links: its sends, receives and acks as frames on
a node's client link port instead of gRPC calls (the node's end and the
reasons: broker/messaging_link.py).

Every node names its link port in its Metadata answer, which the client
reads anyway to find the leader. A Connection keeps one link per node it
calls, dialed in the background on the host of the address it dialled, and
moves its sends, receives and acks there once the handshake is done; until
then, for 5 s after a dial fails and 60 s after a refusal, they go on gRPC
(ClientConfig.links=False: always). Each call carries the same metadata as
on gRPC (the signed headers included) and its deadline, and is answered as
gRPC would answer it. A link behaves as the log's do: several calls in
flight, an overdue answer or a cut connection fails every call waiting on it
(retriable: the client retries them, a send with the same message ids) and
the next call goes on gRPC until a new link is open.
"""
from __future__ import annotations

import asyncio
import ssl
from typing import Callable, Sequence, TypeVar

import grpc

from broker.client.errors import RequestTimeoutError, UnavailableError, call_error
from dledger.rpc.client_link import client_tls_context
from dledger.rpc.credentials import ClientSecurity
from dledger.rpc.link import (LINK_DIAL_TIMEOUT_S, LINK_REFUSED_RETRY_S, LINK_RETRY_S, MAX_REQUESTS_IN_FLIGHT, Link,
                              LinkDialer, dial, frame)
from dledger.rpc.request_stream import StreamFailure
from rpcgen import dledger_pb2
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.relay.v1 import relay_pb2 as rpb

SERVICE = "messaging"   # PeerLinkHello.service (broker/messaging_link.py)
MESSAGING = "/apache.rocketmq.v2.MessagingService/"
# A call's request and metadata travel in one frame (dledger/rpc/link.py: at
# most 64 MiB); a larger one goes on gRPC.
MAX_LINK_REQUEST_BYTES = 60 << 20
# Calls one link carries at once; more go on gRPC. The node stops reading a
# link with MAX_REQUESTS_IN_FLIGHT (256) calls running, and long polls hold
# theirs for up to 20 s: an ack behind them would wait past its timeout and
# take the link down with every call on it.
MAX_CALLS_ON_A_LINK = MAX_REQUESTS_IN_FLIGHT // 2
R = TypeVar("R")


class MessagingLink(Link[rpb.RelayedCall, rpb.RelayedAnswer]):
    response_type = rpb.RelayedAnswer

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def withdraw(self, call_id: int) -> None:
        """Tell the node the caller of `call_id` stopped waiting: it cancels
        the call, as gRPC cancels a call's handler."""
        if self.broken is None and self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame(rpb.RelayedCall(id=call_id, withdrawn=True)))


class MessagingLinks:
    """One connection's links, by node address."""

    def __init__(self, security: ClientSecurity, client_id: str, enabled: bool) -> None:
        self.enabled = enabled
        self._security = security
        self._client_id = client_id
        # address -> (its group, its link port), from its Metadata answers.
        self._targets: dict[str, tuple[str, int]] = {}
        self._dialer: LinkDialer[str, MessagingLink] = LinkDialer("messaging link", "gRPC", LINK_RETRY_S,
                                                                  LINK_REFUSED_RETRY_S)
        self._context: ssl.SSLContext | None = None
        self.closed = False
        # Calls by the path they took (tests, benchmarks).
        self.calls_by_path = {"link": 0, "grpc": 0}

    def learn(self, address: str, answer: dledger_pb2.MetadataResponse) -> None:
        if answer.client_link_port:
            self._targets[address] = (answer.group, answer.client_link_port)

    def knows(self, address: str) -> bool:
        """Whether the node at `address` told its link port."""
        return address in self._targets

    def get(self, address: str) -> MessagingLink | None:
        """The open link to `address` with room for a call, or None (one is
        then dialed in the background if it may be)."""
        link = self._dialer.links.get(address)
        if link is not None:
            return link if link.in_flight < MAX_CALLS_ON_A_LINK else None
        if not self.enabled:
            return None
        target = self._targets.get(address)
        if target is not None and self._dialer.may_dial(address) and not self.closed:
            self._dial(address, *target)
        return None

    def _dial(self, address: str, group: str, port: int) -> None:
        host = address.rpartition(":")[0]
        link_address = f"{host}:{port}"
        security = self._security
        if security.ca and self._context is None:
            self._context = client_tls_context(security.ca)
        signing = (security.user, security.secret) if security.user else None
        self._dialer.dial(address, address, link_address, lambda on_broken: dial(
            MessagingLink(on_broken), link_address, host.strip("[]"), group, self._client_id, signing,
            self._context, LINK_DIAL_TIMEOUT_S, SERVICE), lambda: not self.closed)

    async def close(self) -> None:
        self.closed = True
        await self._dialer.close("the client is closing")

    # ----------------------------------------------------------------- calls
    async def unary(self, link: MessagingLink, address: str, method: str, request: bytes,
                    metadata: Sequence[tuple[str, str]], timeout: float, parse: Callable[[bytes], R]) -> R:
        """`method` on `link` (`request` serialized), its answer parsed by
        `parse` (the response class's FromString). Raises ClientError."""
        return parse((await self._request(link, address, method, request, metadata, timeout)).response)

    async def server_stream(self, link: MessagingLink, address: str, method: str, request: bytes,
                            metadata: Sequence[tuple[str, str]], timeout: float) -> Sequence[bytes]:
        """A server-streaming `method` on `link`: its responses, serialized."""
        return (await self._request(link, address, method, request, metadata, timeout)).responses

    async def _request(self, link: MessagingLink, address: str, method: str, request: bytes,
                       metadata: Sequence[tuple[str, str]], timeout: float) -> rpb.RelayedAnswer:
        call = rpb.RelayedCall(method=MESSAGING + method, request=request, timeout_s=timeout)
        add = call.metadata.add
        for key, value in metadata:
            add(key=key, value=value)
        self.calls_by_path["link"] += 1
        try:
            answer = await link.request(call, timeout)
        except asyncio.CancelledError:
            link.withdraw(call.id)
            raise
        except StreamFailure as failure:
            if failure.timed_out:
                raise RequestTimeoutError(pb.REQUEST_TIMEOUT, f"{method}: {address} did not answer in time "
                                                              f"on its messaging link") from None
            raise UnavailableError(pb.HA_NOT_AVAILABLE, f"{method}: the messaging link to {address}: "
                                                        f"{failure}") from None
        if answer.code:
            raise call_error(_STATUS_BY_NUMBER.get(answer.code, grpc.StatusCode.UNKNOWN), answer.details, address,
                             method)
        return answer


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
