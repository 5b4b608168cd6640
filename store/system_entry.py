"""System entries: the store's own metadata written through the replicated log.

Topic config, subscription groups, consumer offsets and the broker's delayed,
transactional and pop bookkeeping change by appending a system entry; every
replica applies it in log order, so a new leader knows all of it at once
(RocketMQ keeps these per broker and copies them to slaves every 10 s; here
they are replicated like messages).

A system entry shares the message framing's first two fields, so one look at
the magic code tells the apply loop which it is:

    0  TOTALSIZE  int32   whole entry
    4  MAGICCODE  int32   SYSTEM_MAGIC_CODE
    8  KIND       int16   what changed (SystemKind)
   10  PAYLOAD            UTF-8 JSON object

JSON, because these entries are small and rare next to messages, and a person
reading a dump of the log (or the Spark replay) can read them.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from store.errors import MessageDecodeError

# "SYSE": chosen far from RocketMQ's message magic codes (0xDAA320A7/AB) and
# its CommitLog blank (0xCBD43194).
SYSTEM_MAGIC_CODE: Final = 0x53595345
_HEADER = struct.Struct(">iih")


class SystemKind(IntEnum):
    TOPIC_UPDATE = 1
    TOPIC_DELETE = 2
    GROUP_UPDATE = 3
    GROUP_DELETE = 4
    CONSUMER_OFFSETS = 5
    # The whole state of every ConfigManager as of the entry its asOf names
    # (older ones: the entry before it); see store/metadata_snapshot.py.
    METADATA_SNAPSHOT = 6
    # Kinds from 100 belong to the broker (delay offsets, transactions, pop
    # state); the store only routes them to the handler that registered them.
    BROKER_BASE = 100


@dataclass(frozen=True)
class SystemEntry:
    kind: int
    payload: dict[str, Any]


def encode_system_entry(kind: int, payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return _HEADER.pack(_HEADER.size + len(data), SYSTEM_MAGIC_CODE, kind) + data


def decode_system_entry(body: bytes | bytearray | memoryview) -> SystemEntry:
    if len(body) < _HEADER.size:
        raise MessageDecodeError(f"system entry of {len(body)} bytes is shorter than its header")
    size, magic, kind = _HEADER.unpack_from(body)
    if magic != SYSTEM_MAGIC_CODE:
        raise MessageDecodeError(f"magic {magic:#x} is not a system entry")
    if size != len(body):
        raise MessageDecodeError(f"system entry says {size} bytes but holds {len(body)}")
    try:
        payload = json.loads(bytes(body[_HEADER.size:]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MessageDecodeError(f"system entry of kind {kind}: payload is not JSON ({error})") from None
    if not isinstance(payload, dict):
        raise MessageDecodeError(f"system entry of kind {kind}: payload is not a JSON object")
    return SystemEntry(kind, payload)
