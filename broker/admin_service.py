"""The gRPC servicer of pydledger.admin.v1.AdminService: translation only.

Every call is served by the leader (a follower forwards it, like the
messaging service's writes), so a list right after a create sees the create;
every error becomes the protocol's Status in one place (broker/status.py).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

import grpc

from broker.admin import Admin, QueueLag, is_system_topic, permission_of
from broker.broker import Broker
from broker.errors import BrokerError
from broker.operations_service import add_operations_service
from broker.status import ok, status_of
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc
from store.subscription_group import SubscriptionGroupConfig
from store.topic_config import TopicConfig

Response = TypeVar("Response")
Handler = Callable[[Any], Awaitable[Any]]


def add_admin_service(broker: Broker, server: grpc.aio.Server) -> None:
    """Serve the admin services on a node's gRPC server (cluster/node.py):
    this one, and OperationsService (message query, offsets, resend)."""
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(broker), server)
    add_operations_service(broker, server)


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, broker: Broker) -> None:
        self.admin = Admin(broker.store, broker.topics, broker.config.default_queue_nums)
        self.forwarder = broker.forwarder
        self.broker = broker

    async def _unary(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                     response_type: type[Response], handler: Handler) -> Response:
        try:
            if not self.forwarder.is_leader():
                return await self.forwarder.unary(  # type: ignore[no-any-return]
                    method, request, context, admin_pb2_grpc.AdminServiceStub)
            return await handler(request)  # type: ignore[no-any-return]
        except Exception as error:  # noqa: BLE001 - the one place errors become statuses
            return response_type(status=status_of(error))  # type: ignore[call-arg]

    # ----------------------------------------------------------------- topics
    async def CreateTopic(self, request: apb.CreateTopicRequest, context: grpc.aio.ServicerContext
                          ) -> apb.TopicResponse:
        async def create(r: apb.CreateTopicRequest) -> apb.TopicResponse:
            config, created = await self.admin.create_topic(
                r.topic, r.queue_count, _type_name(r.message_type) or "NORMAL", r.permission or pb.READ_WRITE)
            return apb.TopicResponse(status=ok(), topic=self._topic_info(config), created=created)
        return await self._unary("CreateTopic", request, context, apb.TopicResponse, create)

    async def UpdateTopic(self, request: apb.UpdateTopicRequest, context: grpc.aio.ServicerContext
                          ) -> apb.TopicResponse:
        async def update(r: apb.UpdateTopicRequest) -> apb.TopicResponse:
            config = await self.admin.update_topic(
                r.topic, r.queue_count if r.HasField("queue_count") else None,
                _type_name(r.message_type), r.permission or None)
            return apb.TopicResponse(status=ok(), topic=self._topic_info(config))
        return await self._unary("UpdateTopic", request, context, apb.TopicResponse, update)

    async def DeleteTopic(self, request: apb.DeleteTopicRequest, context: grpc.aio.ServicerContext
                          ) -> apb.DeleteTopicResponse:
        async def delete(r: apb.DeleteTopicRequest) -> apb.DeleteTopicResponse:
            await self.admin.delete_topic(r.topic)
            return apb.DeleteTopicResponse(status=ok())
        return await self._unary("DeleteTopic", request, context, apb.DeleteTopicResponse, delete)

    async def ListTopics(self, request: apb.ListTopicsRequest, context: grpc.aio.ServicerContext
                         ) -> apb.ListTopicsResponse:
        async def list_topics(r: apb.ListTopicsRequest) -> apb.ListTopicsResponse:
            return apb.ListTopicsResponse(status=ok(), topics=[
                self._topic_info(c) for c in self.admin.list_topics(r.include_system)])
        return await self._unary("ListTopics", request, context, apb.ListTopicsResponse, list_topics)

    def _topic_info(self, config: TopicConfig) -> apb.TopicInfo:
        return apb.TopicInfo(
            topic=config.topic_name, read_queue_count=config.read_queue_nums,
            write_queue_count=config.write_queue_nums,
            message_type=apb.TopicMessageType.Value(config.message_type),
            permission=permission_of(config.perm), system=is_system_topic(config.topic_name),
            queues=[apb.QueueInfo(queue_id=q, min_offset=low, max_offset=high)
                    for q, low, high in self.admin.queue_offsets(config)])

    # ----------------------------------------------------------------- groups
    async def CreateGroup(self, request: apb.CreateGroupRequest, context: grpc.aio.ServicerContext
                          ) -> apb.GroupResponse:
        async def create(r: apb.CreateGroupRequest) -> apb.GroupResponse:
            config, created = await self.admin.create_group(
                r.group, r.max_retries if r.HasField("max_retries") else None, r.fifo)
            return apb.GroupResponse(status=ok(), group=_group_info(config), created=created)
        return await self._unary("CreateGroup", request, context, apb.GroupResponse, create)

    async def UpdateGroup(self, request: apb.UpdateGroupRequest, context: grpc.aio.ServicerContext
                          ) -> apb.GroupResponse:
        async def update(r: apb.UpdateGroupRequest) -> apb.GroupResponse:
            config = await self.admin.update_group(
                r.group, r.max_retries if r.HasField("max_retries") else None,
                r.fifo if r.HasField("fifo") else None)
            return apb.GroupResponse(status=ok(), group=_group_info(config))
        return await self._unary("UpdateGroup", request, context, apb.GroupResponse, update)

    async def ListGroups(self, request: apb.ListGroupsRequest, context: grpc.aio.ServicerContext
                         ) -> apb.ListGroupsResponse:
        async def list_groups(r: apb.ListGroupsRequest) -> apb.ListGroupsResponse:
            return apb.ListGroupsResponse(status=ok(), groups=[_group_info(g) for g in self.admin.list_groups()])
        return await self._unary("ListGroups", request, context, apb.ListGroupsResponse, list_groups)

    # ---------------------------------------------------------- broker groups
    async def ListBrokerGroups(self, request: apb.ListBrokerGroupsRequest, context: grpc.aio.ServicerContext
                               ) -> apb.ListBrokerGroupsResponse:
        """Served by any node (nothing here is in the log): the name servers'
        groups, or this node's own group when it has none (or none answers)."""
        try:
            return apb.ListBrokerGroupsResponse(status=ok(), self_group=self.broker.config.broker_name,
                                                groups=await broker_groups(self.broker))
        except Exception as error:  # noqa: BLE001 - the one place errors become statuses
            return apb.ListBrokerGroupsResponse(status=status_of(error))

    # -------------------------------------------------------------------- lag
    async def DescribeLag(self, request: apb.DescribeLagRequest, context: grpc.aio.ServicerContext
                          ) -> apb.DescribeLagResponse:
        async def describe(r: apb.DescribeLagRequest) -> apb.DescribeLagResponse:
            lags = self.admin.describe_lag(r.group, r.topic)
            return apb.DescribeLagResponse(status=ok(), queues=[_queue_lag(q) for q in lags],
                                           total_lag=sum(q.lag for q in lags))
        return await self._unary("DescribeLag", request, context, apb.DescribeLagResponse, describe)


async def broker_groups(broker: Broker) -> list[apb.BrokerGroup]:
    config = broker.config
    info = await broker.names.cluster_info() if broker.names is not None else None
    if info is not None and any(g.broker_name == config.broker_name for g in info.groups):
        return [apb.BrokerGroup(name=g.broker_name, leader_id=g.leader_id,
                                addresses=[n.address for n in sorted(g.nodes, key=lambda n: n.broker_id)])
                for g in info.groups]
    # Without name servers (or before this group registered): this group alone.
    own = apb.BrokerGroup(name=config.broker_name, leader_id=broker.server.member_state.leader_id or "",
                          addresses=list(config.endpoints))
    others = [apb.BrokerGroup(name=g.broker_name, leader_id=g.leader_id,
                              addresses=[n.address for n in sorted(g.nodes, key=lambda n: n.broker_id)])
              for g in (info.groups if info is not None else ())]
    return sorted([own, *others], key=lambda g: g.name)


def _type_name(message_type: int) -> str | None:
    """The topic attribute's name for the proto enum; None when unspecified."""
    if message_type == apb.TOPIC_MESSAGE_TYPE_UNSPECIFIED:
        return None
    if message_type not in apb.TopicMessageType.values():
        raise BrokerError(pb.BAD_REQUEST, f"message type {message_type} is not one of "
                                          f"{', '.join(apb.TopicMessageType.keys()[1:])}")
    return apb.TopicMessageType.Name(message_type)


def _group_info(config: SubscriptionGroupConfig) -> apb.GroupInfo:
    return apb.GroupInfo(group=config.group_name, max_retries=config.retry_max_times,
                         fifo=config.consume_message_orderly, consume_enable=config.consume_enable)


def _queue_lag(q: QueueLag) -> apb.QueueLag:
    return apb.QueueLag(topic=q.topic, queue_id=q.queue_id, committed_offset=q.committed_offset,
                        min_offset=q.min_offset, max_offset=q.max_offset, lag=q.lag)
