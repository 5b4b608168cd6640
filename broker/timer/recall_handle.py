"""Recall handles: what SendResultEntry.recall_handle carries for a timed
message and RecallMessage names to cancel it.

A handle is URL-safe base64 (no padding) of "v1 <topic> <physical offset>
<message id>" (RocketMQ's handle is "v1 topic broker timestamp id"): the
physical offset finds the timer on any replica, and the topic and message id
let the broker refuse a handle that names a different message.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

VERSION = "v1"


@dataclass(frozen=True)
class RecallHandle:
    topic: str
    physical_offset: int
    message_id: str

    def encode(self) -> str:
        text = f"{VERSION} {self.topic} {self.physical_offset} {self.message_id}"
        return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, handle: str) -> "RecallHandle":
        """The handle's fields; BAD_REQUEST for anything this broker did not issue."""
        if not handle.strip():
            raise BrokerError(pb.BAD_REQUEST, "the recall handle is empty")
        try:
            text = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode("utf-8")
            version, topic, offset, message_id = text.split(" ")
            physical_offset = int(offset)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise BrokerError(pb.BAD_REQUEST, f"{handle!r} is not a recall handle this broker issued") from None
        if version != VERSION or physical_offset < 0 or not topic or not message_id:
            raise BrokerError(pb.BAD_REQUEST, f"{handle!r} is not a recall handle this broker issued")
        return cls(topic, physical_offset, message_id)
