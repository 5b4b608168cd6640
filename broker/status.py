"""Statuses: every error the broker meets becomes the protocol's Status here,
in one place (the RPC edge calls `status_of`)."""
from __future__ import annotations

import logging

from broker.errors import BrokerError
from dledger.errors import DLedgerError, ResponseCode
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.errors import (ConsumeQueueError, MessageEncodeError, MessageTooLargeError, PropertiesTooLargeError,
                          PutOutcomeUnknownError, QueueIdError, StoreError, StoreFailedError, StoreFullError,
                          StoreUnavailableError, TopicNotFoundError)

log = logging.getLogger(__name__)


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=pb.OK, message=message)


def status_of(error: BaseException) -> pb.Status:
    """The Status a client gets for `error`. Codes a client retries on
    (HA_NOT_AVAILABLE, SLAVE_PERSISTENCE_TIMEOUT) are used for what another
    attempt can fix: no leader yet, a leader that lost its quorum."""
    if isinstance(error, BrokerError):
        return error.to_status()
    code, message = _store_code(error)
    return pb.Status(code=code, message=message)


def _store_code(error: BaseException) -> tuple[int, str]:
    text = str(error)
    if isinstance(error, StoreUnavailableError):
        return pb.HA_NOT_AVAILABLE, text
    if isinstance(error, PutOutcomeUnknownError):
        # The outcome is unknown: the client's retry (same message id) is
        # answered with the original receipt if the message did land.
        return pb.SLAVE_PERSISTENCE_TIMEOUT, text
    if isinstance(error, TopicNotFoundError):
        return pb.TOPIC_NOT_FOUND, text
    if isinstance(error, MessageTooLargeError):
        return pb.MESSAGE_BODY_TOO_LARGE, text
    if isinstance(error, PropertiesTooLargeError):
        return pb.MESSAGE_PROPERTIES_TOO_LARGE, text
    if isinstance(error, (QueueIdError, MessageEncodeError, ConsumeQueueError)):
        return pb.BAD_REQUEST, text
    if isinstance(error, StoreFullError):
        return pb.INTERNAL_SERVER_ERROR, f"the broker's disk is full and it is read-only: {text}"
    if isinstance(error, StoreFailedError):
        return pb.INTERNAL_SERVER_ERROR, f"the broker's store stopped: {text}"
    if isinstance(error, StoreError):
        return pb.INTERNAL_SERVER_ERROR, text
    if isinstance(error, DLedgerError):
        if error.code in (ResponseCode.NOT_LEADER, ResponseCode.LEADER_NOT_READY, ResponseCode.LEADER_TRANSFERRING,
                          ResponseCode.LEADER_PENDING_FULL):
            return pb.HA_NOT_AVAILABLE, error.message
        if error.code in (ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED):
            return pb.SLAVE_PERSISTENCE_TIMEOUT, error.message
        if error.code is ResponseCode.DISK_ERROR:
            # The node's disk failed and it is stopping (fail-stop): what it
            # had pushed may still commit under the next leader, so the
            # outcome is unknown and the client's retry (same message id,
            # same receipt handle) goes there.
            return pb.SLAVE_PERSISTENCE_TIMEOUT, f"this node's disk failed and it is stopping; retry: {error.message}"
        return pb.INTERNAL_SERVER_ERROR, f"{error.code.name}: {error.message}"
    log.exception("unexpected error", exc_info=error)
    return pb.INTERNAL_SERVER_ERROR, f"internal error: {type(error).__name__}: {error}"
