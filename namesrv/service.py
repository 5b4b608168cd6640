"""The gRPC servicer of pydledger.namesrv.v1.NameServer: translation only.

Requests become RouteTable calls (namesrv/route_table.py, where the rules
are); every error becomes the protocol's Status in one place."""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

import grpc

from broker.status import ok, status_of
from broker.validation import validate_topic
from namesrv.metrics import NameServerMetrics
from namesrv.route_table import (DEFAULT_TOPIC, GroupRecord, NodeInfo, Registration, RouteTable, TopicRouteData,
                                 check_name)
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

log = logging.getLogger(__name__)
Response = TypeVar("Response")
Clock = Callable[[], float]


class NameServerServicer(namesrv_pb2_grpc.NameServerServicer):
    def __init__(self, table: RouteTable, metrics: NameServerMetrics, clock: Clock = time.monotonic) -> None:
        self.table = table
        self.metrics = metrics
        self.clock = clock

    async def _unary(self, request: Any, response_type: type[Response],
                     handler: Callable[[Any], Awaitable[Response]]) -> Response:
        try:
            return await handler(request)
        except Exception as error:  # noqa: BLE001 - the one place errors become statuses
            return response_type(status=status_of(error))  # type: ignore[call-arg]

    async def RegisterBroker(self, request: npb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
                             ) -> npb.RegisterBrokerResponse:
        async def register(r: npb.RegisterBrokerRequest) -> npb.RegisterBrokerResponse:
            known = self.table.groups.get(r.broker_name)
            try:
                record = self.table.register(registration_of(r), self.clock())
            except Exception:
                self.metrics.registrations_refused.inc()
                raise
            if known is None or known.leader_id != record.leader_id or known.term != record.term:
                log.info("group %s registered by %s (term %d, %d nodes, %d topics)", record.broker_name,
                         record.leader_id, record.term, len(record.nodes), len(record.topics))
            self.metrics.registrations.inc()
            return npb.RegisterBrokerResponse(status=ok(), expiry_ms=int(self.table.expiry_s * 1000))
        return await self._unary(request, npb.RegisterBrokerResponse, register)

    async def UnregisterBroker(self, request: npb.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
                               ) -> npb.UnregisterBrokerResponse:
        async def unregister(r: npb.UnregisterBrokerRequest) -> npb.UnregisterBrokerResponse:
            check_name(r.broker_name, "broker name")
            check_name(r.node_id, "node id")
            removed = self.table.unregister(r.broker_name, r.node_id, r.term)
            if removed:
                log.info("group %s unregistered by %s", r.broker_name, r.node_id)
            return npb.UnregisterBrokerResponse(status=ok(), removed=removed)
        return await self._unary(request, npb.UnregisterBrokerResponse, unregister)

    async def RouteByTopic(self, request: npb.RouteByTopicRequest, context: grpc.aio.ServicerContext
                           ) -> npb.RouteByTopicResponse:
        async def route(r: npb.RouteByTopicRequest) -> npb.RouteByTopicResponse:
            self.metrics.route_queries.inc()
            if r.topic != DEFAULT_TOPIC:
                validate_topic(r.topic)
            routes = self.table.route(r.topic, self.clock())
            status = ok() if routes else pb.Status(code=pb.TOPIC_NOT_FOUND,
                                                   message=f"no live broker group holds topic {r.topic!r}")
            return npb.RouteByTopicResponse(status=status, routes=[
                npb.TopicRoute(group=group_info(g), config=topic_config(t)) for g, t in routes])
        return await self._unary(request, npb.RouteByTopicResponse, route)

    async def ClusterInfo(self, request: npb.ClusterInfoRequest, context: grpc.aio.ServicerContext
                          ) -> npb.ClusterInfoResponse:
        async def info(r: npb.ClusterInfoRequest) -> npb.ClusterInfoResponse:
            return npb.ClusterInfoResponse(status=ok(), groups=[group_info(g)
                                                                for g in self.table.live_groups(self.clock())])
        return await self._unary(request, npb.ClusterInfoResponse, info)


# ------------------------------------------------------------- translation

def registration_of(request: npb.RegisterBrokerRequest) -> Registration:
    return Registration(
        cluster_name=request.cluster_name, broker_name=request.broker_name, node_id=request.node_id,
        term=request.term,
        nodes=tuple(NodeInfo(n.id, n.address, n.broker_id, n.role) for n in request.nodes),
        topics=tuple(TopicRouteData(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm, t.message_type)
                     for t in request.topics))


def group_info(group: GroupRecord) -> npb.GroupInfo:
    return npb.GroupInfo(cluster_name=group.cluster_name, broker_name=group.broker_name, term=group.term,
                         leader_id=group.leader_id, last_update_ms=group.last_update_wall_ms,
                         topic_count=len(group.topics),
                         nodes=[npb.BrokerNode(id=n.id, address=n.address, broker_id=n.broker_id, role=n.role)
                                for n in group.nodes])


def topic_config(topic: TopicRouteData) -> npb.TopicRouteConfig:
    return npb.TopicRouteConfig(topic=topic.topic, read_queue_nums=topic.read_queue_nums,
                                write_queue_nums=topic.write_queue_nums, perm=topic.perm,
                                message_type=topic.message_type)
