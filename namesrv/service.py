"""The gRPC servicer of pydledger.namesrv.v1.NameServer: translation only.

Requests become RouteTable calls (namesrv/route_table.py, where the rules
are) after NameServerAccess (namesrv/access.py) has said the caller may
make them; every error becomes the protocol's Status in one place. A
secured name server runs one servicer per port: `members_port` marks the
members-only mutual-TLS one."""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

import grpc

from broker.auth.guard import AuthSettings
from broker.auth.interceptor import source_ip
from broker.status import ok, status_of
from broker.validation import validate_topic
from dledger.rpc.credentials import AUTHORIZATION, DATE_TIME
from namesrv.access import Caller, NameServerAccess, check_auth_metadata, cluster_requirements, route_requirements
from namesrv.metrics import NameServerMetrics
from namesrv.route_table import (DEFAULT_TOPIC, GroupRecord, NodeInfo, Registration, RouteTable, TopicRouteData,
                                 check_name)
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

log = logging.getLogger(__name__)
Response = TypeVar("Response")
Clock = Callable[[], float]


_CLIENT_ID = "x-mq-client-id"


def caller_of(context: grpc.aio.ServicerContext, members_port: bool) -> Caller:
    headers = dict(context.invocation_metadata() or ())
    return Caller(authorization=str(headers.get(AUTHORIZATION, "")), date_time=str(headers.get(DATE_TIME, "")),
                  source_ip=source_ip(context), client=str(headers.get(_CLIENT_ID, "")) or context.peer(),
                  members_port=members_port)


class NameServerServicer(namesrv_pb2_grpc.NameServerServicer):
    def __init__(self, table: RouteTable, metrics: NameServerMetrics, clock: Clock = time.monotonic,
                 access: NameServerAccess | None = None, members_port: bool = False) -> None:
        self.table = table
        self.metrics = metrics
        self.clock = clock
        self.access = access or NameServerAccess(AuthSettings(), tls=False)
        self.members_port = members_port

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
                self.access.check_registration(caller_of(context, self.members_port), "RegisterBroker")
                check_auth_metadata(r.auth_metadata)
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
            self.access.check_registration(caller_of(context, self.members_port), "UnregisterBroker")
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
            now = self.clock()
            routes = self.table.route(r.topic, now)
            visible = {g.broker_name for g in self.access.allowed(
                caller_of(context, self.members_port), "RouteByTopic", self.table.live_groups(now),
                [g for g, _ in routes], route_requirements(r.topic))}
            routes = [(g, t) for g, t in routes if g.broker_name in visible]
            status = ok() if routes else pb.Status(code=pb.TOPIC_NOT_FOUND,
                                                   message=f"no live broker group holds topic {r.topic!r}")
            return npb.RouteByTopicResponse(status=status, routes=[
                npb.TopicRoute(group=group_info(g), config=topic_config(t)) for g, t in routes])
        return await self._unary(request, npb.RouteByTopicResponse, route)

    async def ClusterInfo(self, request: npb.ClusterInfoRequest, context: grpc.aio.ServicerContext
                          ) -> npb.ClusterInfoResponse:
        async def info(r: npb.ClusterInfoRequest) -> npb.ClusterInfoResponse:
            live = self.table.live_groups(self.clock())
            visible = self.access.allowed(caller_of(context, self.members_port), "ClusterInfo", live, live,
                                          cluster_requirements())
            return npb.ClusterInfoResponse(status=ok(), groups=[group_info(g) for g in visible])
        return await self._unary(request, npb.ClusterInfoResponse, info)


# ------------------------------------------------------------- translation

def registration_of(request: npb.RegisterBrokerRequest) -> Registration:
    return Registration(
        cluster_name=request.cluster_name, broker_name=request.broker_name, node_id=request.node_id,
        term=request.term,
        nodes=tuple(NodeInfo(n.id, n.address, n.broker_id, n.role) for n in request.nodes),
        topics=tuple(TopicRouteData(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm, t.message_type)
                     for t in request.topics),
        auth_metadata=request.auth_metadata)


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
