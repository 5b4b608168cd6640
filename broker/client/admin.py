"""AdminClient: topics, consumer groups and lag (pydledger.admin.v1.AdminService).

    async with AdminClient(servers) as admin:
        await admin.create_topic("Orders", queues=8, message_type="FIFO")
        for topic in await admin.list_topics(): ...
        await admin.create_group("OrderGroup", max_retries=3)
        lag = await admin.describe_lag("OrderGroup", "Orders")

Every call goes to the leader (any node would forward it), retried across a
leader change like the messaging calls; a refusal raises the typed
ClientError with the protocol's code and the broker's reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from broker.client.config import ClientConfig
from broker.client.connection import Connection
from broker.client.errors import check_status
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc

MESSAGE_TYPES = ("normal", "fifo", "delay", "transaction", "mixed")
PERMISSIONS: dict[str, pb.Permission] = {"none": pb.NONE, "read": pb.READ, "write": pb.WRITE, "read_write": pb.READ_WRITE, "rw": pb.READ_WRITE}


@dataclass(frozen=True)
class QueueOffsets:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    queues: int
    message_type: str
    permission: str
    system: bool
    offsets: list[QueueOffsets] = field(default_factory=list)

    @property
    def messages(self) -> int:
        """Messages retained in all queues."""
        return sum(q.max_offset - q.min_offset for q in self.offsets)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queues": self.queues, "type": self.message_type, "permission": self.permission,
                "system": self.system, "messages": self.messages,
                "offsets": [{"queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset}
                            for q in self.offsets]}


@dataclass(frozen=True)
class GroupInfo:
    group: str
    max_retries: int
    fifo: bool
    consume_enable: bool

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "max_retries": self.max_retries, "fifo": self.fifo,
                "consume_enable": self.consume_enable}


@dataclass(frozen=True)
class QueueLag:
    topic: str
    queue_id: int
    committed_offset: int  # -1: nothing committed
    min_offset: int
    max_offset: int
    lag: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def message_type_value(name: str) -> apb.TopicMessageType:
    if name.lower() not in MESSAGE_TYPES:
        raise ValueError(f"message type {name!r} is not one of {', '.join(MESSAGE_TYPES)}")
    return apb.TopicMessageType.Value(name.upper())


def permission_value(name: str) -> pb.Permission:
    try:
        return PERMISSIONS[name.lower().replace("-", "_")]
    except KeyError:
        raise ValueError(f"permission {name!r} is not one of none, read, write, read_write") from None


@dataclass(frozen=True)
class BrokerGroupInfo:
    """A broker group of the cluster: its name, leader and nodes' addresses."""
    name: str
    leader_id: str
    addresses: tuple[str, ...]


class AdminClient:
    def __init__(self, servers: str | Iterable[str] | ClientConfig, **config: Any) -> None:
        self.config = ClientConfig.of(servers, **config)
        self.connection = Connection(self.config)

    async def __aenter__(self) -> "AdminClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    # ----------------------------------------------------------------- topics
    async def create_topic(self, topic: str, queues: int = 0, message_type: str = "normal",
                           permission: str = "read_write") -> tuple[TopicInfo, bool]:
        """(the topic, whether it was created); an identical topic is no error."""
        request = apb.CreateTopicRequest(topic=topic, queue_count=queues,
                                         message_type=message_type_value(message_type),
                                         permission=permission_value(permission))
        answer = await self._call("CreateTopic", request, f"create topic {topic!r}")
        return _topic(answer.topic), answer.created

    async def update_topic(self, topic: str, queues: int | None = None, message_type: str | None = None,
                           permission: str | None = None) -> TopicInfo:
        request = apb.UpdateTopicRequest(topic=topic)
        if queues is not None:
            request.queue_count = queues
        if message_type is not None:
            request.message_type = message_type_value(message_type)
        if permission is not None:
            request.permission = permission_value(permission)
        return _topic((await self._call("UpdateTopic", request, f"update topic {topic!r}")).topic)

    async def delete_topic(self, topic: str) -> None:
        await self._call("DeleteTopic", apb.DeleteTopicRequest(topic=topic), f"delete topic {topic!r}")

    async def list_topics(self, include_system: bool = False) -> list[TopicInfo]:
        answer = await self._call("ListTopics", apb.ListTopicsRequest(include_system=include_system), "list topics")
        return [_topic(t) for t in answer.topics]

    # ----------------------------------------------------------------- groups
    async def create_group(self, group: str, max_retries: int | None = None,
                           fifo: bool = False) -> tuple[GroupInfo, bool]:
        request = apb.CreateGroupRequest(group=group, fifo=fifo)
        if max_retries is not None:
            request.max_retries = max_retries
        answer = await self._call("CreateGroup", request, f"create group {group!r}")
        return _group(answer.group), answer.created

    async def update_group(self, group: str, max_retries: int | None = None, fifo: bool | None = None) -> GroupInfo:
        request = apb.UpdateGroupRequest(group=group)
        if max_retries is not None:
            request.max_retries = max_retries
        if fifo is not None:
            request.fifo = fifo
        return _group((await self._call("UpdateGroup", request, f"update group {group!r}")).group)

    async def list_groups(self) -> list[GroupInfo]:
        return [_group(g) for g in (await self._call("ListGroups", apb.ListGroupsRequest(), "list groups")).groups]

    async def describe_lag(self, group: str, topic: str = "") -> list[QueueLag]:
        answer = await self._call("DescribeLag", apb.DescribeLagRequest(group=group, topic=topic),
                                  f"lag of {group!r}")
        return [QueueLag(q.topic, q.queue_id, q.committed_offset, q.min_offset, q.max_offset, q.lag)
                for q in answer.queues]

    # ---------------------------------------------------------- broker groups
    async def list_broker_groups(self) -> list[BrokerGroupInfo]:
        """Every broker group the cluster's name servers know (this group
        alone without name servers)."""
        answer = await self._call("ListBrokerGroups", apb.ListBrokerGroupsRequest(), "list broker groups")
        return [BrokerGroupInfo(g.name, g.leader_id, tuple(g.addresses)) for g in answer.groups]

    # --------------------------------------------------------------- plumbing
    async def _call(self, method: str, request: Any, what: str) -> Any:
        connection = self.connection

        async def attempt(address: str) -> Any:
            stub = admin_pb2_grpc.AdminServiceStub(connection.channel(address))
            answer = await getattr(stub, method)(request, metadata=connection.headers(),
                                                 timeout=self.config.request_timeout_s)
            check_status(answer.status, what)
            return answer

        return await connection.call(what, attempt)


def _topic(info: apb.TopicInfo) -> TopicInfo:
    return TopicInfo(info.topic, max(info.read_queue_count, info.write_queue_count),
                     apb.TopicMessageType.Name(info.message_type).lower(),
                     pb.Permission.Name(info.permission).lower(), info.system,
                     [QueueOffsets(q.queue_id, q.min_offset, q.max_offset) for q in info.queues])


def _group(info: apb.GroupInfo) -> GroupInfo:
    return GroupInfo(info.group, info.max_retries, info.fifo, info.consume_enable)

