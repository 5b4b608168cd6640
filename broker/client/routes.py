"""RouteCache: a topic's queues, kept for a while.

With one broker group a producer needs no route (the broker picks the
queue); consumers do: a receive names a queue of the topic, a pull consumer
reads queue by queue. With several groups the producer needs it too: the
route says which groups hold the topic and where each is reached.

Routes come from the name servers when the client is given some (the first
that answers; a topic none of them knows is asked of the servers, which
create it when auto-creation is on), else from any node (QueryRoute answers
for every group). They are refreshed after `ttl_s` (the official clients:
every 30 s), and at once after a failure (`invalidate`), so that queues an
admin adds and groups that come and go are picked up.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from broker.client.connection import Connection, access_point
from broker.client.errors import ClientError, check_status
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

log = logging.getLogger(__name__)

ROUTE_TTL_S = 30.0
PERM_WRITE, PERM_READ = 2, 4
MESSAGE_TYPES = {"NORMAL": [pb.NORMAL], "FIFO": [pb.FIFO], "DELAY": [pb.DELAY], "TRANSACTION": [pb.TRANSACTION]}


@dataclass(frozen=True)
class Route:
    queues: list[pb.MessageQueue]
    fetched_at: float

    @property
    def readable(self) -> list[pb.MessageQueue]:
        return [q for q in self.queues if q.permission in (pb.READ, pb.READ_WRITE) and q.broker.id == 0]


class RouteCache:
    def __init__(self, connection: Connection, ttl_s: float = ROUTE_TTL_S) -> None:
        self.connection = connection
        self.ttl_s = ttl_s
        self._routes: dict[str, Route] = {}

    async def route(self, topic: str, refresh: bool = False, once: bool = False) -> Route:
        """The topic's route. `once`: one attempt (no retries until the
        deadline), and a failed refresh keeps the route already known (a
        producer's lookup must not hold its sends up for a whole deadline)."""
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached.fetched_at < self.ttl_s:
            return cached
        try:
            queues = await self._from_name_servers(topic) if self.connection.config.namesrv_addrs else None
            route = Route(queues if queues else await self._query(topic, once), time.monotonic())
        except ClientError:
            if once and cached is not None:
                return cached
            raise
        self._routes[topic] = route
        return route

    def known(self, topic: str) -> bool:
        return topic in self._routes

    def invalidate(self, topic: str) -> None:
        """Fetch the route again on its next use (after a failure); until a
        fetch succeeds, a lookup with `once` still has the old one."""
        cached = self._routes.get(topic)
        if cached is not None:
            self._routes[topic] = Route(cached.queues, float("-inf"))

    async def _query(self, topic: str, once: bool = False) -> list[pb.MessageQueue]:
        connection = self.connection
        request = spb.QueryRouteRequest(topic=connection.resource(topic),
                                        endpoints=access_point(connection.config.servers))

        async def attempt(address: str) -> list[pb.MessageQueue]:
            answer = await connection.messaging(address).QueryRoute(
                request, metadata=connection.headers(), timeout=connection.config.request_timeout_s)
            check_status(answer.status, f"route of {topic!r}")
            return list(answer.message_queues)

        return await connection.call("QueryRoute", attempt, (lambda error: False) if once else None)

    async def _from_name_servers(self, topic: str) -> list[pb.MessageQueue] | None:
        """The topic's queues as the first name server that answers knows
        them; None when none answers or none knows the topic."""
        connection = self.connection
        for address in connection.config.namesrv_addrs:
            stub = namesrv_pb2_grpc.NameServerStub(connection.channel(address))
            try:
                # Signed as every call is: a secured name server answers
                # only what the groups' ACLs let this user see.
                answer = await stub.RouteByTopic(npb.RouteByTopicRequest(topic=topic), metadata=connection.headers(),
                                                 timeout=connection.config.request_timeout_s)
            except grpc.aio.AioRpcError as error:
                log.debug("name server %s: %s; trying the next", address, error.code().name)
                continue
            if answer.status.code == pb.OK:
                return [q for route in answer.routes for q in _queues(route)]
            if answer.status.code in (pb.UNAUTHORIZED, pb.FORBIDDEN):
                log.warning("name server %s refused the route of %r: %s; asking the nodes", address, topic,
                            answer.status.message)
            return None
        return None


def _queues(route: npb.TopicRoute) -> list[pb.MessageQueue]:
    """A name server's route of one group as the protocol's queues."""
    addresses = [n.address for n in sorted(route.group.nodes, key=lambda n: n.broker_id)]
    endpoints = access_point(addresses)
    broker = pb.Broker(name=route.group.broker_name, id=0, endpoints=endpoints)
    config = route.config
    accepted = MESSAGE_TYPES.get(config.message_type, [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION])
    queues = []
    for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
        readable = queue_id < config.read_queue_nums and config.perm & PERM_READ
        writable = queue_id < config.write_queue_nums and config.perm & PERM_WRITE
        permission = (pb.READ_WRITE if readable and writable else pb.READ if readable
                      else pb.WRITE if writable else pb.NONE)
        queues.append(pb.MessageQueue(topic=pb.Resource(name=config.topic), id=queue_id, permission=permission,
                                      broker=broker, accept_message_types=accepted))
    return queues
