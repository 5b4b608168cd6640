from rpcgen.apache.rocketmq.v2 import definition_pb2 as _definition_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BrokerNode(_message.Message):
    __slots__ = ("id", "address", "broker_id", "role")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    broker_id: int
    role: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., broker_id: _Optional[int] = ..., role: _Optional[str] = ...) -> None: ...

class TopicRouteConfig(_message.Message):
    __slots__ = ("topic", "read_queue_nums", "write_queue_nums", "perm", "message_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str
    def __init__(self, topic: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., message_type: _Optional[str] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "node_id", "term", "nodes", "topics", "auth_metadata")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    AUTH_METADATA_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    node_id: str
    term: int
    nodes: _containers.RepeatedCompositeFieldContainer[BrokerNode]
    topics: _containers.RepeatedCompositeFieldContainer[TopicRouteConfig]
    auth_metadata: bytes
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., node_id: _Optional[str] = ..., term: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[BrokerNode, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicRouteConfig, _Mapping]]] = ..., auth_metadata: _Optional[bytes] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("status", "expiry_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    expiry_ms: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., expiry_ms: _Optional[int] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("broker_name", "node_id", "term")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    node_id: str
    term: int
    def __init__(self, broker_name: _Optional[str] = ..., node_id: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ("status", "removed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    removed: bool
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., removed: _Optional[bool] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "term", "leader_id", "nodes", "last_update_ms", "topic_count")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    term: int
    leader_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[BrokerNode]
    last_update_ms: int
    topic_count: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[BrokerNode, _Mapping]]] = ..., last_update_ms: _Optional[int] = ..., topic_count: _Optional[int] = ...) -> None: ...

class RouteByTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("group", "config")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    group: GroupInfo
    config: TopicRouteConfig
    def __init__(self, group: _Optional[_Union[GroupInfo, _Mapping]] = ..., config: _Optional[_Union[TopicRouteConfig, _Mapping]] = ...) -> None: ...

class RouteByTopicResponse(_message.Message):
    __slots__ = ("status", "routes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    routes: _containers.RepeatedCompositeFieldContainer[TopicRoute]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., routes: _Optional[_Iterable[_Union[TopicRoute, _Mapping]]] = ...) -> None: ...

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterInfoResponse(_message.Message):
    __slots__ = ("status", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...
