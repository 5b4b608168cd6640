"""NameServerClient: a node's channels to the name servers (RocketMQ's
BrokerOuterAPI): the registrar's registrations and the route lookups of
QueryRoute go through it. Name servers are peers that know the same thing
(every group registers with each), so a lookup takes the first that answers.

On a secured cluster the addresses are the name servers' members ports: the
node dials them with its own certificate (mutual TLS) and, with auth on,
signs every call as the bootstrap super user (a name server on one shared
port checks that signature instead).
"""
from __future__ import annotations

import asyncio
import itertools
import logging

import grpc

from dledger.rpc import tls
from dledger.rpc.channel import channel_options
from dledger.rpc.credentials import signing_interceptors
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

log = logging.getLogger(__name__)


class NameServerClient:
    def __init__(self, addresses: tuple[str, ...], timeout_s: float, material: tls.TlsMaterial = tls.PLAINTEXT,
                 signing: tuple[str, str] | None = None) -> None:
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.material = material
        self.signing = signing
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._turn = itertools.count()

    def stub(self, address: str) -> namesrv_pb2_grpc.NameServerStub:
        channel = self._channels.get(address)
        if channel is None:
            # A name server restarted is reached again within half a second,
            # not after gRPC's default backoff (up to 120 s).
            channel = self._channels[address] = tls.channel(
                address, channel_options(16 << 20, max_reconnect_backoff_ms=500), material=self.material,
                interceptors=signing_interceptors(*self.signing) if self.signing else None)
        return namesrv_pb2_grpc.NameServerStub(channel)

    def _in_turn(self) -> list[str]:
        """Every name server, starting from the next in turn (spreads lookups)."""
        start = next(self._turn) % len(self.addresses)
        return list(self.addresses[start:] + self.addresses[:start])

    async def route_by_topic(self, topic: str, timeout_s: float | None = None) -> npb.RouteByTopicResponse | None:
        """The first answer (OK or TOPIC_NOT_FOUND) of any name server; None
        when none answers."""
        for address in self._in_turn():
            try:
                answer = await self.stub(address).RouteByTopic(npb.RouteByTopicRequest(topic=topic),
                                                               timeout=timeout_s or self.timeout_s)
            except grpc.aio.AioRpcError as error:
                log.debug("name server %s: %s", address, error.code().name)
                continue
            if answer.status.code in (pb.OK, pb.TOPIC_NOT_FOUND):
                return answer
            log.warning("name server %s refused the route of %r: %s", address, topic, answer.status.message)
        return None

    async def cluster_info(self) -> npb.ClusterInfoResponse | None:
        for address in self._in_turn():
            try:
                answer = await self.stub(address).ClusterInfo(npb.ClusterInfoRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError:
                continue
            if answer.status.code == pb.OK:
                return answer
        return None

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
