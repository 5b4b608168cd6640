"""The message store's error vocabulary.

Everything under `store/` raises a `StoreError` subclass, so that the broker can
turn store problems into protocol status codes in one place. Errors caused by a
caller's bad input also subclass ValueError; they are raised before anything is
written, so bad input never changes a file.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the message store raises on purpose."""


class MessageDecodeError(StoreError):
    """Bytes that are not a valid stored message: bad magic code, truncated
    record, body CRC mismatch, malformed topic or properties."""


class MessageEncodeError(StoreError, ValueError):
    """A message that cannot be stored in RocketMQ's layout (a field out of
    range, a property name or value containing a separator, ...)."""


class PropertiesTooLargeError(MessageEncodeError):
    """Encoded properties longer than RocketMQ's limit of 32767 bytes
    (the broker answers MESSAGE_PROPERTIES_TOO_LARGE)."""


class ConsumeQueueError(StoreError, ValueError):
    """A ConsumeQueue put that would break the queue: a gap above the end,
    a different unit over an existing one, an offset below the minimum."""


class CorruptFileError(StoreError):
    """A store file on disk is not what its name and the configuration say
    (wrong size, missing segment in the middle of a queue, bad header)."""


class StoreUnavailableError(StoreError):
    """This node cannot serve the request now, and another node or a little
    later can: it is not the leader (`leader_id`/`leader_address` say who is,
    when known), it is a new leader still applying the log up to its term,
    or the store is stopping. Nothing was written."""

    def __init__(self, message: str, leader_id: str = "", leader_address: str = "") -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class PutOutcomeUnknownError(StoreError):
    """The messages were written to the leader's log but not known to be
    committed (no quorum in time, or leadership lost): they may or may not
    become visible. A retry may store them twice; the broker dedupes retries
    by message id."""


class StoreStartError(StoreError):
    """The store's files cannot be served by this configuration; the message
    says what to do. The node does not start."""


class StoreFullError(StoreError):
    """The disk holding the log is (nearly) full: the store is read-only."""


class StoreFailedError(StoreError):
    """The apply loop met a committed entry it cannot apply (an invariant
    broke: corruption or a bug). The store stops deriving state rather than
    derive it wrongly; reads of what was applied still work."""


class TopicNotFoundError(StoreError, ValueError):
    """A put to a topic that has no configuration (the broker creates topics
    first, when auto-creation is on)."""


class QueueIdError(StoreError, ValueError):
    """A queue id outside the topic's queues."""


class MessageTooLargeError(StoreError, ValueError):
    """A stored message larger than the store's maximum message size."""
