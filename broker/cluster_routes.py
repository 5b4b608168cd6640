"""ClusterRoutes: a topic's route over every broker group (what QueryRoute
and QueryAssignment answer when the node is configured with name servers).

Each group holding the topic contributes its queues, each queue naming its
own group as the broker (name = the group, id 0, endpoints = that group's
nodes): a client sends to a queue's endpoints, so the group that owns the
queue stores the message. This node's own group is read from its own
topic table (always current); the others come from the name servers, as
their leaders last registered them.

A topic no group holds is created, when auto-creation is on, in every group
that registered the default topic TBW102 (RocketMQ's auto-create path),
with TBW102's queue count: this node's group directly, the others through
their admin service. Without a name server answer only this group counts.
"""
from __future__ import annotations

import logging

import grpc

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.namesrv_client import NameServerClient
from broker.registration import DEFAULT_TOPIC
from broker.topics import TopicService, message_queues, route_endpoints
from dledger.rpc import tls
from dledger.rpc.credentials import signing_interceptors
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb

log = logging.getLogger(__name__)

# A client's QueryRoute waits for this lookup (the official clients allow a
# call 3 s): a name server that does not answer is given up on quickly, the
# next one asked, and with none this group's own queues are the answer.
ROUTE_LOOKUP_TIMEOUT_S = 1.0


def group_queues(route: npb.TopicRoute) -> list[pb.MessageQueue]:
    """A route's queues in the group the name server names, broker id 0 and
    that group's endpoints."""
    endpoints = route_endpoints(tuple(n.address for n in route.group.nodes))
    broker = pb.Broker(name=route.group.broker_name, id=0, endpoints=endpoints)
    c = route.config
    return message_queues(c.topic, c.read_queue_nums, c.write_queue_nums, c.perm, c.message_type, broker)


class ClusterRoutes:
    def __init__(self, config: BrokerConfig, topics: TopicService, names: NameServerClient,
                 material: tls.TlsMaterial = tls.PLAINTEXT, signing: tuple[str, str] | None = None) -> None:
        self.config = config
        self.topics = topics
        self.names = names
        # Another group's client port: TLS trusting the cluster CA, calls
        # signed as the bootstrap super user (the groups of one secured
        # cluster share it, as `cluster up --secure --groups` makes them).
        self._ca = material.ca
        self._signing = signing

    async def route(self, topic: str, create: bool) -> list[pb.MessageQueue]:
        """The topic's queues in every group holding it; `create`: make it
        first where it is missing everywhere (the caller leads this group)."""
        local = self.topics.get(topic)
        queues = self.topics.queues_of(local) if local is not None else []
        answer = await self.names.route_by_topic(topic, ROUTE_LOOKUP_TIMEOUT_S)
        for route in answer.routes if answer is not None else ():
            if route.group.broker_name != self.config.broker_name:
                queues += group_queues(route)
        if queues:
            return queues
        if not create:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"no broker group holds topic {topic!r}")
        return await self._create(topic)

    async def _create(self, topic: str) -> list[pb.MessageQueue]:
        default = await self.names.route_by_topic(DEFAULT_TOPIC)
        groups = list(default.routes) if default is not None else []
        queues = self.topics.queues_of(await self.topics.ensure_for_send(topic))
        for route in groups:
            if route.group.broker_name == self.config.broker_name:
                continue
            created = await self._create_in(route, topic)
            if created is not None:
                queues += created
        log.info("auto-created topic %s in %d group(s)", topic,
                 len({q.broker.name for q in queues}))
        return queues

    async def _create_in(self, route: npb.TopicRoute, topic: str) -> list[pb.MessageQueue] | None:
        """Create the topic in another group through any of its nodes (a
        follower forwards to its leader); None when none of them could."""
        request = apb.CreateTopicRequest(topic=topic, queue_count=route.config.write_queue_nums,
                                         message_type=apb.MIXED, permission=pb.READ_WRITE)
        for node in route.group.nodes:
            try:
                interceptors = signing_interceptors(*self._signing) if self._signing else None
                async with tls.channel(node.address, ca=self._ca, interceptors=interceptors) as channel:
                    answer = await admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
                        request, timeout=self.config.forward_timeout_s)
            except grpc.aio.AioRpcError as error:
                log.debug("creating %s in %s through %s: %s", topic, route.group.broker_name, node.address,
                          error.code().name)
                continue
            if answer.status.code != pb.OK:
                log.warning("group %s did not create topic %s: %s", route.group.broker_name, topic,
                            answer.status.message)
                return None
            info = answer.topic
            made = npb.TopicRoute(group=route.group, config=npb.TopicRouteConfig(
                topic=topic, read_queue_nums=info.read_queue_count, write_queue_nums=info.write_queue_count,
                perm=route.config.perm, message_type="MIXED"))
            return group_queues(made)
        return None
