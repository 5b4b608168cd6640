"""One error vocabulary for the broker: the protocol's status codes.

Raise `BrokerError(code, message)` where a problem is found, with a code from
`apache.rocketmq.v2.Code`; the RPC edge turns it into the response's `Status`
in one place. Clients branch on the code (the Python client maps 400xx to
BadRequestException, 42900 stops a producer's retries, ...), so the code must
be the protocol's, and the message must tell a person what to change.
"""
from __future__ import annotations

from rpcgen.apache.rocketmq.v2 import definition_pb2
from rpcgen.apache.rocketmq.v2.definition_pb2 import Code

# Codes below 40000 (CODE_UNSPECIFIED, OK, MULTIPLE_RESULTS) describe success:
# an error carrying one would tell the client that a failed call succeeded.
_FIRST_ERROR_CODE = definition_pb2.BAD_REQUEST


class BrokerError(Exception):
    """A request the broker refuses or could not serve, with the protocol's code."""

    def __init__(self, code: Code, message: str) -> None:
        name = Code.Name(code)  # raises ValueError for a number the protocol lacks
        if code < _FIRST_ERROR_CODE:
            raise ValueError(f"{name} is not an error code")
        super().__init__(f"{name}: {message}")
        self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        return Code.Name(self.code)

    def to_status(self) -> definition_pb2.Status:
        return definition_pb2.Status(code=self.code, message=self.message)
