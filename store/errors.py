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
