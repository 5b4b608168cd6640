"""Typed exceptions of the client, each carrying the protocol's Code.

The class says what kind of problem it is (the way the official clients map
code / 100: 400xx bad request, 404xx not found, ...); `code` is the exact
`apache.rocketmq.v2.Code` number and `code_name` its name; `retriable` says
whether sending the same request again (with the same message id, so the
broker recognises a repeat) can succeed. The client retries those itself
until its deadline; an application sees them only when the deadline passed.
"""
from __future__ import annotations

import grpc

from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

# The outcome of a write is unknown (it may be stored): a retry with the same
# message id is answered with the original receipt if it was.
OUTCOME_UNKNOWN_CODES = frozenset({pb.SLAVE_PERSISTENCE_TIMEOUT, pb.MASTER_PERSISTENCE_TIMEOUT,
                                   pb.PROXY_TIMEOUT, pb.REQUEST_TIMEOUT})
# No leader, no quorum, a node unreachable: surely not done, another attempt may work.
UNAVAILABLE_CODES = frozenset({pb.HA_NOT_AVAILABLE})
RETRIABLE_CODES = OUTCOME_UNKNOWN_CODES | UNAVAILABLE_CODES


class ClientError(Exception):
    """A request the cluster refused or could not serve."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{self.code_name}: {message}")

    @property
    def code_name(self) -> str:
        try:
            return pb.Code.Name(self.code)
        except ValueError:
            return f"CODE_{self.code}"

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE_CODES


class BadRequestError(ClientError):
    """400xx: the request is wrong (name, size, type, receipt handle, ...); fix it."""


class UnauthorizedError(ClientError):
    """401xx."""


class ForbiddenError(ClientError):
    """403xx: e.g. a topic without write permission."""


class NotFoundError(ClientError):
    """404xx: no such topic, consumer group or offset."""


class RequestTimeoutError(ClientError):
    """The request was not answered in time; its outcome is unknown."""


class PayloadTooLargeError(ClientError):
    """413xx and 431xx: body or properties too large."""


class PreconditionFailedError(ClientError):
    """428xx: e.g. the client is not started or already closed."""


class TooManyRequestsError(ClientError):
    """429xx: throttled; not retried automatically."""


class InternalServerError(ClientError):
    """500xx: the broker failed."""


class UnavailableError(ClientError):
    """No leader, no quorum or no node reachable right now."""


class OutcomeUnknownError(ClientError):
    """The broker could not confirm the write in time; it may be stored."""


class UnsupportedError(ClientError):
    """501xx and 505xx: the broker does not implement this."""


_BY_CLASS: dict[int, type[ClientError]] = {
    400: BadRequestError, 401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError,
    408: RequestTimeoutError, 413: PayloadTooLargeError, 428: PreconditionFailedError,
    429: TooManyRequestsError, 431: PayloadTooLargeError, 500: InternalServerError,
    501: UnsupportedError, 504: OutcomeUnknownError, 505: UnsupportedError,
}


def error_for(code: int, message: str) -> ClientError:
    """The typed exception for a protocol code."""
    if code in UNAVAILABLE_CODES:
        return UnavailableError(code, message)
    return _BY_CLASS.get(code // 100, ClientError)(code, message)


def check_status(status: pb.Status, what: str) -> None:
    """Raise the typed exception for a non-OK status (MULTIPLE_RESULTS is a
    batch whose entries carry their own status)."""
    if status.code in (pb.OK, pb.MULTIPLE_RESULTS):
        return
    if status.code == pb.CODE_UNSPECIFIED:
        raise InternalServerError(pb.INTERNAL_SERVER_ERROR, f"{what}: the broker answered without a status")
    raise error_for(status.code, f"{what}: {status.message or pb.Code.Name(status.code)}")


def transport_error(error: grpc.aio.AioRpcError, address: str, what: str) -> ClientError:
    """A gRPC failure in the same vocabulary."""
    return call_error(error.code(), error.details() or "", address, what)


def call_error(code: grpc.StatusCode, detail: str, address: str, what: str) -> ClientError:
    """A call that ended with gRPC status `code` (on a gRPC call or a
    messaging link), in the same vocabulary. Unreachable and timed out are
    retriable (a timeout's outcome is unknown; the message id makes the retry
    safe); anything else is the broker's fault or ours."""
    detail = detail or code.name
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(pb.HA_NOT_AVAILABLE, f"{what}: {address} unavailable: {detail}")
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return RequestTimeoutError(pb.REQUEST_TIMEOUT, f"{what}: {address} did not answer in time")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PayloadTooLargeError(pb.PAYLOAD_TOO_LARGE, f"{what}: {address}: {detail}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnsupportedError(pb.NOT_IMPLEMENTED, f"{what}: {address} does not serve it: {detail}")
    return InternalServerError(pb.INTERNAL_SERVER_ERROR, f"{what}: {address}: {code.name}: {detail}")
