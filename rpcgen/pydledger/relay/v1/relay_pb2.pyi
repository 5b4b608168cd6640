from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RelayedCall(_message.Message):
    __slots__ = ("id", "method", "metadata", "request", "timeout_s", "withdrawn")
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    metadata: _containers.RepeatedCompositeFieldContainer[Header]
    request: bytes
    timeout_s: float
    withdrawn: bool
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., metadata: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., request: _Optional[bytes] = ..., timeout_s: _Optional[float] = ..., withdrawn: _Optional[bool] = ...) -> None: ...

class RelayedAnswer(_message.Message):
    __slots__ = ("id", "code", "details", "response", "responses")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    id: int
    code: int
    details: str
    response: bytes
    responses: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, id: _Optional[int] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., response: _Optional[bytes] = ..., responses: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("calls", "cancelled")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[RelayedCall]
    cancelled: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, calls: _Optional[_Iterable[_Union[RelayedCall, _Mapping]]] = ..., cancelled: _Optional[_Iterable[int]] = ...) -> None: ...

class RelayResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[RelayedAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[RelayedAnswer, _Mapping]]] = ...) -> None: ...
