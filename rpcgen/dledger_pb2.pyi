from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VoteResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VOTE_UNKNOWN: _ClassVar[VoteResult]
    ACCEPT: _ClassVar[VoteResult]
    REJECT_UNKNOWN_LEADER: _ClassVar[VoteResult]
    REJECT_UNEXPECTED_LEADER: _ClassVar[VoteResult]
    REJECT_EXPIRED_VOTE_TERM: _ClassVar[VoteResult]
    REJECT_ALREADY_VOTED: _ClassVar[VoteResult]
    REJECT_ALREADY_HAS_LEADER: _ClassVar[VoteResult]
    REJECT_TERM_NOT_READY: _ClassVar[VoteResult]
    REJECT_TERM_SMALL_THAN_LEDGER: _ClassVar[VoteResult]
    REJECT_EXPIRED_LEDGER_TERM: _ClassVar[VoteResult]
    REJECT_SMALL_LEDGER_END_INDEX: _ClassVar[VoteResult]
    REJECT_TAKING_LEADERSHIP: _ClassVar[VoteResult]
    REJECT_REPAIRING: _ClassVar[VoteResult]
    REJECT_NOT_JOINED: _ClassVar[VoteResult]
    REJECT_OTHER_CLUSTER: _ClassVar[VoteResult]
    REJECT_NOT_VOTER: _ClassVar[VoteResult]
    REJECT_MOVED: _ClassVar[VoteResult]

class PushType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUSH_UNKNOWN: _ClassVar[PushType]
    APPEND: _ClassVar[PushType]
    COMMIT: _ClassVar[PushType]
    COMPARE: _ClassVar[PushType]
    TRUNCATE: _ClassVar[PushType]

class MembershipAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBERSHIP_ACTION_UNKNOWN: _ClassVar[MembershipAction]
    ADD_MEMBER: _ClassVar[MembershipAction]
    REMOVE_MEMBER: _ClassVar[MembershipAction]
    MOVE_MEMBER: _ClassVar[MembershipAction]
VOTE_UNKNOWN: VoteResult
ACCEPT: VoteResult
REJECT_UNKNOWN_LEADER: VoteResult
REJECT_UNEXPECTED_LEADER: VoteResult
REJECT_EXPIRED_VOTE_TERM: VoteResult
REJECT_ALREADY_VOTED: VoteResult
REJECT_ALREADY_HAS_LEADER: VoteResult
REJECT_TERM_NOT_READY: VoteResult
REJECT_TERM_SMALL_THAN_LEDGER: VoteResult
REJECT_EXPIRED_LEDGER_TERM: VoteResult
REJECT_SMALL_LEDGER_END_INDEX: VoteResult
REJECT_TAKING_LEADERSHIP: VoteResult
REJECT_REPAIRING: VoteResult
REJECT_NOT_JOINED: VoteResult
REJECT_OTHER_CLUSTER: VoteResult
REJECT_NOT_VOTER: VoteResult
REJECT_MOVED: VoteResult
PUSH_UNKNOWN: PushType
APPEND: PushType
COMMIT: PushType
COMPARE: PushType
TRUNCATE: PushType
MEMBERSHIP_ACTION_UNKNOWN: MembershipAction
ADD_MEMBER: MembershipAction
REMOVE_MEMBER: MembershipAction
MOVE_MEMBER: MembershipAction

class Header(_message.Message):
    __slots__ = ("group", "remote_id", "local_id", "code", "leader_id", "term", "message", "leader_address")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    group: str
    remote_id: str
    local_id: str
    code: int
    leader_id: str
    term: int
    message: str
    leader_address: str
    def __init__(self, group: _Optional[str] = ..., remote_id: _Optional[str] = ..., local_id: _Optional[str] = ..., code: _Optional[int] = ..., leader_id: _Optional[str] = ..., term: _Optional[int] = ..., message: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("header", "ledger_end_index", "ledger_end_term", "pre_vote", "leadership_transfer", "cluster_id", "incarnation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_TRANSFER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    header: Header
    ledger_end_index: int
    ledger_end_term: int
    pre_vote: bool
    leadership_transfer: bool
    cluster_id: str
    incarnation: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., ledger_end_index: _Optional[int] = ..., ledger_end_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ..., leadership_transfer: _Optional[bool] = ..., cluster_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("header", "result", "ledger_end_index", "ledger_end_term", "cluster_id", "repairing", "repair_until", "repair_term")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_TERM_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    REPAIR_UNTIL_FIELD_NUMBER: _ClassVar[int]
    REPAIR_TERM_FIELD_NUMBER: _ClassVar[int]
    header: Header
    result: VoteResult
    ledger_end_index: int
    ledger_end_term: int
    cluster_id: str
    repairing: bool
    repair_until: int
    repair_term: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., result: _Optional[_Union[VoteResult, str]] = ..., ledger_end_index: _Optional[int] = ..., ledger_end_term: _Optional[int] = ..., cluster_id: _Optional[str] = ..., repairing: _Optional[bool] = ..., repair_until: _Optional[int] = ..., repair_term: _Optional[int] = ...) -> None: ...

class HeartBeatRequest(_message.Message):
    __slots__ = ("header", "committed_index", "cluster_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    header: Header
    committed_index: int
    cluster_id: str
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., committed_index: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class HeartBeatResponse(_message.Message):
    __slots__ = ("header", "peer_link_port")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PEER_LINK_PORT_FIELD_NUMBER: _ClassVar[int]
    header: Header
    peer_link_port: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., peer_link_port: _Optional[int] = ...) -> None: ...

class PushEntryRequest(_message.Message):
    __slots__ = ("header", "type", "index", "index_term", "committed_index", "entries", "entry_count", "reset", "reset_pos", "reset_chain_crc", "cluster_id", "membership", "membership_index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    INDEX_TERM_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    RESET_POS_FIELD_NUMBER: _ClassVar[int]
    RESET_CHAIN_CRC_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_INDEX_FIELD_NUMBER: _ClassVar[int]
    header: Header
    type: PushType
    index: int
    index_term: int
    committed_index: int
    entries: bytes
    entry_count: int
    reset: bool
    reset_pos: int
    reset_chain_crc: int
    cluster_id: str
    membership: bytes
    membership_index: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., type: _Optional[_Union[PushType, str]] = ..., index: _Optional[int] = ..., index_term: _Optional[int] = ..., committed_index: _Optional[int] = ..., entries: _Optional[bytes] = ..., entry_count: _Optional[int] = ..., reset: _Optional[bool] = ..., reset_pos: _Optional[int] = ..., reset_chain_crc: _Optional[int] = ..., cluster_id: _Optional[str] = ..., membership: _Optional[bytes] = ..., membership_index: _Optional[int] = ...) -> None: ...

class PushEntryResponse(_message.Message):
    __slots__ = ("header", "type", "index", "ledger_end_index", "ledger_end_term", "flushed_index", "conflict_term", "conflict_index", "ledger_begin_index", "repairing")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_TERM_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_BEGIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    header: Header
    type: PushType
    index: int
    ledger_end_index: int
    ledger_end_term: int
    flushed_index: int
    conflict_term: int
    conflict_index: int
    ledger_begin_index: int
    repairing: bool
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., type: _Optional[_Union[PushType, str]] = ..., index: _Optional[int] = ..., ledger_end_index: _Optional[int] = ..., ledger_end_term: _Optional[int] = ..., flushed_index: _Optional[int] = ..., conflict_term: _Optional[int] = ..., conflict_index: _Optional[int] = ..., ledger_begin_index: _Optional[int] = ..., repairing: _Optional[bool] = ...) -> None: ...

class PeerStreamRequest(_message.Message):
    __slots__ = ("id", "push", "heartbeat")
    ID_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    id: int
    push: PushEntryRequest
    heartbeat: HeartBeatRequest
    def __init__(self, id: _Optional[int] = ..., push: _Optional[_Union[PushEntryRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartBeatRequest, _Mapping]] = ...) -> None: ...

class PeerStreamResponse(_message.Message):
    __slots__ = ("id", "push", "heartbeat")
    ID_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    id: int
    push: PushEntryResponse
    heartbeat: HeartBeatResponse
    def __init__(self, id: _Optional[int] = ..., push: _Optional[_Union[PushEntryResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartBeatResponse, _Mapping]] = ...) -> None: ...

class PeerLinkChallenge(_message.Message):
    __slots__ = ("nonce", "group", "node_id")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    group: str
    node_id: str
    def __init__(self, nonce: _Optional[bytes] = ..., group: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class PeerLinkHello(_message.Message):
    __slots__ = ("group", "sender_id", "user", "proof", "service")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    group: str
    sender_id: str
    user: str
    proof: bytes
    service: str
    def __init__(self, group: _Optional[str] = ..., sender_id: _Optional[str] = ..., user: _Optional[str] = ..., proof: _Optional[bytes] = ..., service: _Optional[str] = ...) -> None: ...

class PeerLinkWelcome(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: str
    def __init__(self, refused: _Optional[str] = ...) -> None: ...

class LeadershipTransferRequest(_message.Message):
    __slots__ = ("header", "transferee_id", "take_leadership_ledger_index", "from_leader")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TRANSFEREE_ID_FIELD_NUMBER: _ClassVar[int]
    TAKE_LEADERSHIP_LEDGER_INDEX_FIELD_NUMBER: _ClassVar[int]
    FROM_LEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    transferee_id: str
    take_leadership_ledger_index: int
    from_leader: bool
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., transferee_id: _Optional[str] = ..., take_leadership_ledger_index: _Optional[int] = ..., from_leader: _Optional[bool] = ...) -> None: ...

class LeadershipTransferResponse(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("header", "bodies", "producer_id", "sequence", "retry_age_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    producer_id: str
    sequence: int
    retry_age_ms: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., bodies: _Optional[_Iterable[bytes]] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., retry_age_ms: _Optional[int] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("header", "first_index", "last_index", "positions")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    first_index: int
    last_index: int
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class AppendStreamRequest(_message.Message):
    __slots__ = ("id", "append", "counts")
    ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    id: int
    append: AppendRequest
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., append: _Optional[_Union[AppendRequest, _Mapping]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class CallerOutcome(_message.Message):
    __slots__ = ("code", "message", "first_index", "last_index")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    first_index: int
    last_index: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ...) -> None: ...

class AppendStreamResponse(_message.Message):
    __slots__ = ("id", "header", "first_index", "last_index", "positions", "outcomes", "link_port")
    ID_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    LINK_PORT_FIELD_NUMBER: _ClassVar[int]
    id: int
    header: Header
    first_index: int
    last_index: int
    positions: _containers.RepeatedScalarFieldContainer[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[CallerOutcome]
    link_port: int
    def __init__(self, id: _Optional[int] = ..., header: _Optional[_Union[Header, _Mapping]] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., positions: _Optional[_Iterable[int]] = ..., outcomes: _Optional[_Iterable[_Union[CallerOutcome, _Mapping]]] = ..., link_port: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("index", "term", "pos", "magic", "body", "body_crc", "chain_crc", "channel")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    MAGIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_CRC_FIELD_NUMBER: _ClassVar[int]
    CHAIN_CRC_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    pos: int
    magic: int
    body: bytes
    body_crc: int
    chain_crc: int
    channel: int
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., pos: _Optional[int] = ..., magic: _Optional[int] = ..., body: _Optional[bytes] = ..., body_crc: _Optional[int] = ..., chain_crc: _Optional[int] = ..., channel: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("header", "index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    header: Header
    index: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., index: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("header", "entry")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    header: Header
    entry: Entry
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("header", "start_index", "end_index", "max_batch_bytes", "include_system", "require_leader", "raw")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_LEADER_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    header: Header
    start_index: int
    end_index: int
    max_batch_bytes: int
    include_system: bool
    require_leader: bool
    raw: bool
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., start_index: _Optional[int] = ..., end_index: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ..., include_system: _Optional[bool] = ..., require_leader: _Optional[bool] = ..., raw: _Optional[bool] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("header", "entries", "committed_index", "leader_confirmed", "raw_records", "raw_data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    RAW_RECORDS_FIELD_NUMBER: _ClassVar[int]
    RAW_DATA_FIELD_NUMBER: _ClassVar[int]
    header: Header
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    committed_index: int
    leader_confirmed: bool
    raw_records: bytes
    raw_data: bytes
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., committed_index: _Optional[int] = ..., leader_confirmed: _Optional[bool] = ..., raw_records: _Optional[bytes] = ..., raw_data: _Optional[bytes] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class PeerState(_message.Message):
    __slots__ = ("id", "address", "watermark", "lag", "role")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    watermark: int
    lag: int
    role: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., watermark: _Optional[int] = ..., lag: _Optional[int] = ..., role: _Optional[str] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("header", "group", "self_id", "role", "term", "leader_id", "leader_address", "ledger_begin_index", "ledger_end_index", "committed_index", "peers", "pid", "metrics_address", "flushed_index", "ledger_end_term", "cluster_id", "repairing", "repair_until", "no_intact_copy", "client_link_port")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SELF_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_BEGIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEDGER_END_TERM_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    REPAIR_UNTIL_FIELD_NUMBER: _ClassVar[int]
    NO_INTACT_COPY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_LINK_PORT_FIELD_NUMBER: _ClassVar[int]
    header: Header
    group: str
    self_id: str
    role: str
    term: int
    leader_id: str
    leader_address: str
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerState]
    pid: int
    metrics_address: str
    flushed_index: int
    ledger_end_term: int
    cluster_id: str
    repairing: bool
    repair_until: int
    no_intact_copy: str
    client_link_port: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., group: _Optional[str] = ..., self_id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., ledger_begin_index: _Optional[int] = ..., ledger_end_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerState, _Mapping]]] = ..., pid: _Optional[int] = ..., metrics_address: _Optional[str] = ..., flushed_index: _Optional[int] = ..., ledger_end_term: _Optional[int] = ..., cluster_id: _Optional[str] = ..., repairing: _Optional[bool] = ..., repair_until: _Optional[int] = ..., no_intact_copy: _Optional[str] = ..., client_link_port: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "address", "role", "client_address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    role: str
    client_address: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., client_address: _Optional[str] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("header", "action", "member_id", "address", "client_address")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    action: MembershipAction
    member_id: str
    address: str
    client_address: str
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., action: _Optional[_Union[MembershipAction, str]] = ..., member_id: _Optional[str] = ..., address: _Optional[str] = ..., client_address: _Optional[str] = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ("header", "members", "index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    header: Header
    members: _containers.RepeatedCompositeFieldContainer[Member]
    index: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("header", "members", "pending_index")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_INDEX_FIELD_NUMBER: _ClassVar[int]
    header: Header
    members: _containers.RepeatedCompositeFieldContainer[Member]
    pending_index: int
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., pending_index: _Optional[int] = ...) -> None: ...
