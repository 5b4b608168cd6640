from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UserRequest(_message.Message):
    __slots__ = ("name", "secret", "user_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    secret: str
    user_type: str
    def __init__(self, name: _Optional[str] = ..., secret: _Optional[str] = ..., user_type: _Optional[str] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("name", "user_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    user_type: str
    def __init__(self, name: _Optional[str] = ..., user_type: _Optional[str] = ...) -> None: ...

class UserReply(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: UserInfo
    def __init__(self, user: _Optional[_Union[UserInfo, _Mapping]] = ...) -> None: ...

class DeleteUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersReply(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    def __init__(self, users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ...) -> None: ...

class AclEntry(_message.Message):
    __slots__ = ("resource", "actions", "source_ips", "decision")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    resource: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    def __init__(self, resource: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., source_ips: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ...) -> None: ...

class Acl(_message.Message):
    __slots__ = ("subject", "entries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    entries: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, subject: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class CreateAclRequest(_message.Message):
    __slots__ = ("subject", "entries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    entries: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, subject: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class DeleteAclRequest(_message.Message):
    __slots__ = ("subject", "resources")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ...) -> None: ...

class AclReply(_message.Message):
    __slots__ = ("acl",)
    ACL_FIELD_NUMBER: _ClassVar[int]
    acl: Acl
    def __init__(self, acl: _Optional[_Union[Acl, _Mapping]] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class ListAclsReply(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[Acl]
    def __init__(self, acls: _Optional[_Iterable[_Union[Acl, _Mapping]]] = ...) -> None: ...
