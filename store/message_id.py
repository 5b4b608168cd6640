"""Message ids: the offset message id and RocketMQ 5's client message id.

Offset message id (MessageDecoder.createMessageId): the store host's address
bytes, its port (int32) and the message's physical offset (int64), as
uppercase hex: 32 characters for IPv4, 56 for IPv6. It names where a message
is stored, so a retry that stores the message again gets a new one.

Client message id, version 01 (rocketmq-clients' MessageIdCodec), 17 bytes as
34 uppercase hex characters:

    01 | 6 bytes MAC (lower 6 bytes) | 2 bytes pid (lower 2) |
       4 bytes seconds since 2021-01-01T00:00:00Z (lower 4) | 4 bytes sequence

The producer assigns it (UNIQ_KEY) and keeps it across retries, which is why the
broker indexes it and can use it to spot duplicates.
"""
from __future__ import annotations

import itertools
import os
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Final

from store.socket_address import SocketAddress

_PORT_AND_OFFSET = struct.Struct(">iq")

CLIENT_MESSAGE_ID_VERSION_V1: Final = "01"
CLIENT_MESSAGE_ID_LENGTH: Final = 34
# 2021-01-01T00:00:00Z in seconds since the Unix epoch.
CLIENT_MESSAGE_ID_EPOCH: Final = 1609459200

_CLIENT_ID_TAIL = struct.Struct(">6sHII")  # mac, pid, seconds, sequence


def create_offset_message_id(store_host: SocketAddress, physical_offset: int) -> str:
    """Store host address + port + physical offset as uppercase hex."""
    return (store_host.packed_ip() + _PORT_AND_OFFSET.pack(store_host.port, physical_offset)).hex().upper()


def decode_offset_message_id(message_id: str) -> tuple[SocketAddress, int]:
    """(store host, physical offset) of an offset message id; ValueError when it is not one."""
    if len(message_id) not in (32, 56):
        raise ValueError(f"offset message id {message_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters")
    try:
        raw = bytes.fromhex(message_id)
    except ValueError:
        raise ValueError(f"offset message id {message_id!r} is not hexadecimal") from None
    ip_length = len(raw) - _PORT_AND_OFFSET.size
    port, offset = _PORT_AND_OFFSET.unpack_from(raw, ip_length)
    return SocketAddress.from_packed_ip(raw[:ip_length], port), offset


@dataclass(frozen=True, slots=True)
class ClientMessageId:
    """The parts of a version 01 client message id."""

    mac: bytes
    pid: int
    seconds_since_2021: int
    sequence: int

    def __str__(self) -> str:
        tail = _CLIENT_ID_TAIL.pack(self.mac, self.pid, self.seconds_since_2021, self.sequence)
        return CLIENT_MESSAGE_ID_VERSION_V1 + tail.hex().upper()


def parse_client_message_id(message_id: str) -> ClientMessageId:
    """The parts of a version 01 id; ValueError for any other string."""
    if len(message_id) != CLIENT_MESSAGE_ID_LENGTH or not message_id.startswith(CLIENT_MESSAGE_ID_VERSION_V1):
        raise ValueError(f"{message_id!r} is not a version 01 client message id "
                         f"({CLIENT_MESSAGE_ID_LENGTH} hex characters starting with 01)")
    try:
        mac, pid, seconds, sequence = _CLIENT_ID_TAIL.unpack(bytes.fromhex(message_id[2:]))
    except ValueError:
        raise ValueError(f"client message id {message_id!r} is not hexadecimal") from None
    return ClientMessageId(mac, pid, seconds, sequence)


class MessageIdGenerator:
    """Version 01 client message ids, unique per process; safe to call from
    any thread and from coroutines (it never awaits)."""

    def __init__(self, mac: bytes | None = None, pid: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if mac is None:
            # uuid.getnode() falls back to a random 48-bit number (multicast
            # bit set) when no MAC can be found: what the Java client does too.
            mac = uuid.getnode().to_bytes(6, "big")
        if len(mac) != 6:
            raise ValueError(f"mac must be 6 bytes, got {len(mac)}")
        self._prefix = mac + ((os.getpid() if pid is None else pid) & 0xFFFF).to_bytes(2, "big")
        self._clock = clock
        self._sequence = itertools.count()
        self._lock = threading.Lock()

    def next_id(self) -> str:
        seconds = (int(self._clock()) - CLIENT_MESSAGE_ID_EPOCH) & 0xFFFFFFFF
        with self._lock:
            sequence = next(self._sequence) & 0xFFFFFFFF
        return CLIENT_MESSAGE_ID_VERSION_V1 + (self._prefix + struct.pack(">II", seconds, sequence)).hex().upper()
