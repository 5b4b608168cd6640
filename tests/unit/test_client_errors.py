"""broker.client's error vocabulary: each protocol code becomes the exception
class an application catches, and only what another attempt can fix is
retried (the producer's retries depend on it)."""
from __future__ import annotations

import pytest

from broker.client.errors import (BadRequestError, InternalServerError, NotFoundError, OutcomeUnknownError,
                                  PayloadTooLargeError, RequestTimeoutError, TooManyRequestsError, UnavailableError,
                                  UnsupportedError, check_status, error_for)
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb


@pytest.mark.parametrize("code, error_type, retriable", [
    (pb.ILLEGAL_TOPIC, BadRequestError, False),
    (pb.INVALID_RECEIPT_HANDLE, BadRequestError, False),
    (pb.TOPIC_NOT_FOUND, NotFoundError, False),
    (pb.MESSAGE_BODY_TOO_LARGE, PayloadTooLargeError, False),
    (pb.MESSAGE_PROPERTIES_TOO_LARGE, PayloadTooLargeError, False),
    (pb.TOO_MANY_REQUESTS, TooManyRequestsError, False),      # throttled: backing off is the caller's call
    (pb.INTERNAL_SERVER_ERROR, InternalServerError, False),
    (pb.NOT_IMPLEMENTED, UnsupportedError, False),
    (pb.HA_NOT_AVAILABLE, UnavailableError, True),             # no leader or quorum yet
    (pb.SLAVE_PERSISTENCE_TIMEOUT, OutcomeUnknownError, True),  # maybe stored: the same message id is safe
    (pb.PROXY_TIMEOUT, OutcomeUnknownError, True),
    (pb.REQUEST_TIMEOUT, RequestTimeoutError, True),
])
def test_a_code_becomes_its_exception_class_and_retriability(code, error_type, retriable):
    error = error_for(code, "why")
    assert type(error) is error_type
    assert (error.code, error.code_name, error.retriable) == (code, pb.Code.Name(code), retriable)


def test_ok_and_multiple_results_pass_and_a_missing_status_is_an_error():
    check_status(pb.Status(code=pb.OK), "send")
    check_status(pb.Status(code=pb.MULTIPLE_RESULTS), "ack")
    with pytest.raises(InternalServerError):
        check_status(pb.Status(), "send")
    with pytest.raises(NotFoundError, match="TOPIC_NOT_FOUND: send: no such topic"):
        check_status(pb.Status(code=pb.TOPIC_NOT_FOUND, message="no such topic"), "send")
