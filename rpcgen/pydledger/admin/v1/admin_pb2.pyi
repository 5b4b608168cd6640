from rpcgen.apache.rocketmq.v2 import definition_pb2 as _definition_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicMessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPIC_MESSAGE_TYPE_UNSPECIFIED: _ClassVar[TopicMessageType]
    NORMAL: _ClassVar[TopicMessageType]
    FIFO: _ClassVar[TopicMessageType]
    DELAY: _ClassVar[TopicMessageType]
    TRANSACTION: _ClassVar[TopicMessageType]
    MIXED: _ClassVar[TopicMessageType]
TOPIC_MESSAGE_TYPE_UNSPECIFIED: TopicMessageType
NORMAL: TopicMessageType
FIFO: TopicMessageType
DELAY: TopicMessageType
TRANSACTION: TopicMessageType
MIXED: TopicMessageType

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "message_type", "permission")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    message_type: TopicMessageType
    permission: _definition_pb2.Permission
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., message_type: _Optional[_Union[TopicMessageType, str]] = ..., permission: _Optional[_Union[_definition_pb2.Permission, str]] = ...) -> None: ...

class UpdateTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_count", "message_type", "permission")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_count: int
    message_type: TopicMessageType
    permission: _definition_pb2.Permission
    def __init__(self, topic: _Optional[str] = ..., queue_count: _Optional[int] = ..., message_type: _Optional[_Union[TopicMessageType, str]] = ..., permission: _Optional[_Union[_definition_pb2.Permission, str]] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("topic", "read_queue_count", "write_queue_count", "message_type", "permission", "system", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    read_queue_count: int
    write_queue_count: int
    message_type: TopicMessageType
    permission: _definition_pb2.Permission
    system: bool
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    def __init__(self, topic: _Optional[str] = ..., read_queue_count: _Optional[int] = ..., write_queue_count: _Optional[int] = ..., message_type: _Optional[_Union[TopicMessageType, str]] = ..., permission: _Optional[_Union[_definition_pb2.Permission, str]] = ..., system: _Optional[bool] = ..., queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ...) -> None: ...

class TopicResponse(_message.Message):
    __slots__ = ("status", "topic", "created")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topic: TopicInfo
    created: bool
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topic: _Optional[_Union[TopicInfo, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("include_system",)
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    include_system: bool
    def __init__(self, include_system: _Optional[bool] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("status", "topics")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("group", "max_retries", "fifo")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    group: str
    max_retries: int
    fifo: bool
    def __init__(self, group: _Optional[str] = ..., max_retries: _Optional[int] = ..., fifo: _Optional[bool] = ...) -> None: ...

class UpdateGroupRequest(_message.Message):
    __slots__ = ("group", "max_retries", "fifo")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    group: str
    max_retries: int
    fifo: bool
    def __init__(self, group: _Optional[str] = ..., max_retries: _Optional[int] = ..., fifo: _Optional[bool] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "max_retries", "fifo", "consume_enable")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    CONSUME_ENABLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    max_retries: int
    fifo: bool
    consume_enable: bool
    def __init__(self, group: _Optional[str] = ..., max_retries: _Optional[int] = ..., fifo: _Optional[bool] = ..., consume_enable: _Optional[bool] = ...) -> None: ...

class GroupResponse(_message.Message):
    __slots__ = ("status", "group", "created")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    group: GroupInfo
    created: bool
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., group: _Optional[_Union[GroupInfo, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("status", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class DescribeLagRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueLag(_message.Message):
    __slots__ = ("topic", "queue_id", "committed_offset", "min_offset", "max_offset", "lag")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed_offset: int
    min_offset: int
    max_offset: int
    lag: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class DescribeLagResponse(_message.Message):
    __slots__ = ("status", "queues", "total_lag")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    queues: _containers.RepeatedCompositeFieldContainer[QueueLag]
    total_lag: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueLag, _Mapping]]] = ..., total_lag: _Optional[int] = ...) -> None: ...

class ListBrokerGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerGroup(_message.Message):
    __slots__ = ("name", "leader_id", "addresses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    leader_id: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., leader_id: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class ListBrokerGroupsResponse(_message.Message):
    __slots__ = ("status", "self_group", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SELF_GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    self_group: str
    groups: _containers.RepeatedCompositeFieldContainer[BrokerGroup]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., self_group: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[BrokerGroup, _Mapping]]] = ...) -> None: ...
