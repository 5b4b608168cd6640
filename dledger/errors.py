"""One error vocabulary: DLedger's response codes and the exception that carries them.

Raise `DLedgerError(code, message)` where a problem is found; the RPC edge turns
it into a response header in one place (dledger/rpc/service.py).
"""
from __future__ import annotations

from enum import IntEnum


class ResponseCode(IntEnum):
    """DLedger's DLedgerResponseCode numbers, kept so that operators who know
    DLedger recognise them in logs and on the wire."""

    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    NEWER_INSTALL_SNAPSHOT_REQUEST_EXIST = 422
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506
    LOAD_SNAPSHOT_ERROR = 507
    INSTALL_SNAPSHOT_ERROR = 508
    # Ours, beyond DLedger's table.
    ENTRY_TOO_LARGE = 430
    CORRUPT_LOG = 431
    # A membership change is refused while another one is not yet committed.
    MEMBERSHIP_CHANGE_IN_PROGRESS = 432
    # A secured node refused the caller: no or bad credentials (gRPC
    # UNAUTHENTICATED), or its ACLs do not allow the call (PERMISSION_DENIED).
    UNAUTHENTICATED = 433
    FORBIDDEN = 434
    # No leader can be elected because voters lost committed entries (a
    # damaged disk, a lost one) and no reachable node holds them intact: the
    # group refuses to serve rather than invent them (dledger/vote_rules.py).
    NO_INTACT_COPY = 435

    @classmethod
    def of(cls, value: int) -> "ResponseCode":
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class DLedgerError(Exception):
    """An error with a DLedger response code and a message a person can act on."""

    def __init__(self, code: ResponseCode, message: str, *, leader_id: str = "",
                 leader_address: str = "") -> None:
        super().__init__(f"{code.name}({int(code)}): {message}")
        self.code = code
        self.message = message
        self.leader_id = leader_id
        self.leader_address = leader_address


class CorruptLogError(DLedgerError):
    """Stored data failed a check (CRC, magic, index continuity) in a place where
    it cannot be a torn tail: the node must not start, or the read must fail."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.CORRUPT_LOG, message)
