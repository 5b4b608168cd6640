from rpcgen.apache.rocketmq.v2 import definition_pb2 as _definition_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_STATE_UNSPECIFIED: _ClassVar[DeliveryState]
    PENDING: _ClassVar[DeliveryState]
    IN_FLIGHT: _ClassVar[DeliveryState]
    AWAITING_REDELIVERY: _ClassVar[DeliveryState]
    BLOCKED: _ClassVar[DeliveryState]
    CONSUMED: _ClassVar[DeliveryState]

class ResetPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESET_POSITION_UNSPECIFIED: _ClassVar[ResetPosition]
    EARLIEST: _ClassVar[ResetPosition]
    LATEST: _ClassVar[ResetPosition]
DELIVERY_STATE_UNSPECIFIED: DeliveryState
PENDING: DeliveryState
IN_FLIGHT: DeliveryState
AWAITING_REDELIVERY: DeliveryState
BLOCKED: DeliveryState
CONSUMED: DeliveryState
RESET_POSITION_UNSPECIFIED: ResetPosition
EARLIEST: ResetPosition
LATEST: ResetPosition

class Delivery(_message.Message):
    __slots__ = ("group", "state", "attempts", "lease_deadline_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    state: DeliveryState
    attempts: int
    lease_deadline_ms: int
    def __init__(self, group: _Optional[str] = ..., state: _Optional[_Union[DeliveryState, str]] = ..., attempts: _Optional[int] = ..., lease_deadline_ms: _Optional[int] = ...) -> None: ...

class MessageView(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "physical_offset", "offset_message_id", "message_id", "tag", "keys", "properties", "born_timestamp_ms", "store_timestamp_ms", "born_host", "store_host", "reconsume_times", "body", "body_size", "delivery")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    offset_message_id: str
    message_id: str
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    body: bytes
    body_size: int
    delivery: Delivery
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., physical_offset: _Optional[int] = ..., offset_message_id: _Optional[str] = ..., message_id: _Optional[str] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp_ms: _Optional[int] = ..., store_timestamp_ms: _Optional[int] = ..., born_host: _Optional[str] = ..., store_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., body: _Optional[bytes] = ..., body_size: _Optional[int] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("status", "messages", "next_offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    messages: _containers.RepeatedCompositeFieldContainer[MessageView]
    next_offset: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[MessageView, _Mapping]]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class QueryMessageByKeyRequest(_message.Message):
    __slots__ = ("topic", "key", "begin_ms", "end_ms", "max", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEGIN_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    begin_ms: int
    end_ms: int
    max: int
    group: str
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., begin_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., max: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class QueryMessageByIdRequest(_message.Message):
    __slots__ = ("message_id", "topic", "group")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    group: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class QueryMessageByOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "timestamp_ms", "count", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    timestamp_ms: int
    count: int
    group: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., count: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class ResendMessageRequest(_message.Message):
    __slots__ = ("message_id", "topic", "group")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    group: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ResendMessageResponse(_message.Message):
    __slots__ = ("status", "message", "entry_index")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRY_INDEX_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    message: MessageView
    entry_index: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., message: _Optional[_Union[MessageView, _Mapping]] = ..., entry_index: _Optional[int] = ...) -> None: ...

class GroupProgressRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueProgress(_message.Message):
    __slots__ = ("topic", "queue_id", "committed_offset", "min_offset", "max_offset", "lag", "in_flight", "retrying", "expired", "blocked", "last_consumed_store_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RETRYING_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    LAST_CONSUMED_STORE_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed_offset: int
    min_offset: int
    max_offset: int
    lag: int
    in_flight: int
    retrying: int
    expired: int
    blocked: int
    last_consumed_store_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., retrying: _Optional[int] = ..., expired: _Optional[int] = ..., blocked: _Optional[int] = ..., last_consumed_store_ms: _Optional[int] = ...) -> None: ...

class TopicDeadLetters(_message.Message):
    __slots__ = ("topic", "count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    count: int
    def __init__(self, topic: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class GroupProgressResponse(_message.Message):
    __slots__ = ("status", "queues", "total_lag", "dead_letters", "dead_letters_by_topic")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_BY_TOPIC_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    queues: _containers.RepeatedCompositeFieldContainer[QueueProgress]
    total_lag: int
    dead_letters: int
    dead_letters_by_topic: _containers.RepeatedCompositeFieldContainer[TopicDeadLetters]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueProgress, _Mapping]]] = ..., total_lag: _Optional[int] = ..., dead_letters: _Optional[int] = ..., dead_letters_by_topic: _Optional[_Iterable[_Union[TopicDeadLetters, _Mapping]]] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("queue_id", "offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    offset: int
    def __init__(self, queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ResetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "timestamp_ms", "position", "queue_offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    timestamp_ms: int
    position: ResetPosition
    queue_offset: QueueOffset
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., position: _Optional[_Union[ResetPosition, str]] = ..., queue_offset: _Optional[_Union[QueueOffset, _Mapping]] = ...) -> None: ...

class QueueReset(_message.Message):
    __slots__ = ("queue_id", "previous_offset", "offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    previous_offset: int
    offset: int
    def __init__(self, queue_id: _Optional[int] = ..., previous_offset: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ResetOffsetResponse(_message.Message):
    __slots__ = ("status", "queues", "entry_index")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_INDEX_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    queues: _containers.RepeatedCompositeFieldContainer[QueueReset]
    entry_index: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueReset, _Mapping]]] = ..., entry_index: _Optional[int] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("group", "max", "before_offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    BEFORE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    max: int
    before_offset: int
    def __init__(self, group: _Optional[str] = ..., max: _Optional[int] = ..., before_offset: _Optional[int] = ...) -> None: ...

class ResendDeadLetterRequest(_message.Message):
    __slots__ = ("group", "message_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    message_id: str
    def __init__(self, group: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class DescribeStoreRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeStoreResponse(_message.Message):
    __slots__ = ("status", "self_id", "applied_index", "committed_index", "topics", "groups")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SELF_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    self_id: str
    applied_index: int
    committed_index: int
    topics: int
    groups: int
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., self_id: _Optional[str] = ..., applied_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., topics: _Optional[int] = ..., groups: _Optional[int] = ...) -> None: ...
