"""RouteCache: a topic's queues (QueryRoute), kept for a while.

A producer needs no route (the broker picks the queue); consumers do: a
receive names a queue of the topic, a pull consumer reads queue by queue.
Routes are refreshed after `ttl_s` (the official clients: every 30 s), so
queues an admin adds are picked up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from broker.client.connection import Connection, access_point
from broker.client.errors import check_status
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

ROUTE_TTL_S = 30.0


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

    async def route(self, topic: str, refresh: bool = False) -> Route:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached.fetched_at < self.ttl_s:
            return cached
        route = Route(await self._query(topic), time.monotonic())
        self._routes[topic] = route
        return route

    async def _query(self, topic: str) -> list[pb.MessageQueue]:
        connection = self.connection
        request = spb.QueryRouteRequest(topic=connection.resource(topic),
                                        endpoints=access_point(connection.config.servers))

        async def attempt(address: str) -> list[pb.MessageQueue]:
            answer = await connection.messaging(address).QueryRoute(
                request, metadata=connection.headers(), timeout=connection.config.request_timeout_s)
            check_status(answer.status, f"route of {topic!r}")
            return list(answer.message_queues)

        return await connection.call("QueryRoute", attempt)
