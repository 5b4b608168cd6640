"""The RPC edge: where a DLedgerError becomes a response code, in one place.

Both the gRPC servicer and the in-memory test transport answer through
`answer`, so the Raft code is exercised with exactly the responses a real
peer would send.
"""
from __future__ import annotations

import inspect
import logging
import time
from typing import Awaitable, Callable, TypeVar

from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState
from rpcgen import dledger_pb2 as pb

log = logging.getLogger(__name__)

Resp = TypeVar("Resp")

# Codes that are part of normal operation (a client looking for the leader, a
# follower being caught up): not worth a log line each.
ROUTINE_CODES = frozenset({
    ResponseCode.NOT_LEADER, ResponseCode.INCONSISTENT_STATE, ResponseCode.REPEATED_PUSH,
    ResponseCode.EXPIRED_TERM, ResponseCode.LEADER_TRANSFERRING, ResponseCode.TERM_CHANGED,
    ResponseCode.LEADER_NOT_READY,
})


class RejectLog:
    """Log each rejected request once, but at most once a second per code, so a
    misbehaving client cannot flood the log; the count of the rest is kept."""

    def __init__(self) -> None:
        self._last: dict[ResponseCode, float] = {}
        self._suppressed: dict[ResponseCode, int] = {}

    def note(self, method: str, error: DLedgerError) -> None:
        if error.code in ROUTINE_CODES:
            return
        now = time.monotonic()
        if now - self._last.get(error.code, 0.0) < 1.0:
            self._suppressed[error.code] = self._suppressed.get(error.code, 0) + 1
            return
        self._last[error.code] = now
        more = self._suppressed.pop(error.code, 0)
        log.warning("%s rejected: %s%s", method, error, f" (+{more} more like it)" if more else "")


REJECTS = RejectLog()


def fill_header(response: Resp, member_state: MemberState, requester: str, code: int, message: str,
                leader_id: str = "", leader_address: str = "") -> Resp:
    header: pb.Header = response.header  # type: ignore[attr-defined]
    header.code = code
    header.message = message
    header.term = member_state.term
    header.local_id = member_state.self_id
    header.remote_id = requester
    header.group = member_state.config.group
    header.leader_id = leader_id or member_state.leader_id
    header.leader_address = leader_address or member_state.leader_address
    return response


async def answer(method: str, member_state: MemberState, request: object, response_type: type[Resp],
                 handler: Callable[[], Awaitable[Resp] | Resp]) -> Resp:
    requester = request.header.local_id  # type: ignore[attr-defined]
    try:
        result = handler()
        response = await result if inspect.isawaitable(result) else result  # type: ignore[misc]
        code = response.header.code or ResponseCode.SUCCESS  # type: ignore[attr-defined]
        return fill_header(response, member_state, requester, code, response.header.message)  # type: ignore[attr-defined]
    except DLedgerError as e:
        REJECTS.note(method, e)
        return fill_header(response_type(), member_state, requester, e.code, e.message,
                           e.leader_id, e.leader_address)
    except Exception as e:  # the one place that turns a bug into an answer
        log.exception("%s failed", method)
        return fill_header(response_type(), member_state, requester, ResponseCode.INTERNAL_ERROR,
                           f"internal error: {type(e).__name__}: {e}")
