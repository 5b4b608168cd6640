"""A host and port as RocketMQ stores them: 4 (IPv4) or 16 (IPv6) address bytes
followed by the port as an int32 (BORNHOST, STOREHOST, the offset message id)."""
from __future__ import annotations

import functools
import socket
import struct
from dataclasses import dataclass

from store.errors import MessageEncodeError

_PORT = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class SocketAddress:
    """An IP literal (no host names: the stored form is the address bytes) and a port."""

    host: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    def packed_ip(self) -> bytes:
        """The 4 or 16 address bytes; MessageEncodeError when `host` is not an IP literal."""
        return _packed_ip(self.host)

    def packed(self) -> bytes:
        """Address bytes then the port as a big-endian int32 (8 or 20 bytes)."""
        return _packed(self.host, self.port)

    @staticmethod
    def from_packed_ip(ip: bytes, port: int) -> "SocketAddress":
        return _from_packed_ip(ip, port)

    @classmethod
    def parse(cls, text: str) -> "SocketAddress":
        """"1.2.3.4:10911" or "[::1]:10911"."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{text!r} is not HOST:PORT")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        address = cls(host, int(port))
        address.packed()  # validates now rather than at the first encode
        return address

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.is_ipv6 else f"{self.host}:{self.port}"


UNSPECIFIED = SocketAddress("0.0.0.0", 0)


# Encoding and decoding meet the same few hosts over and over (this broker as store host,
# a handful of producers as born hosts); a cache saves building a frozen
# dataclass, or parsing and formatting the address, for every message.
@functools.lru_cache(maxsize=4096)
def _packed_ip(host: str) -> bytes:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.inet_pton(family, host)
    except OSError:
        raise MessageEncodeError(f"host {host!r} is not an IPv4 or IPv6 address") from None


@functools.lru_cache(maxsize=4096)
def _packed(host: str, port: int) -> bytes:
    if not 0 <= port <= 0xFFFF:
        raise MessageEncodeError(f"port {port} of {host} is outside 0..65535")
    return _packed_ip(host) + _PORT.pack(port)


@functools.lru_cache(maxsize=4096)
def _from_packed_ip(ip: bytes, port: int) -> SocketAddress:
    if len(ip) == 4:
        return SocketAddress(socket.inet_ntoa(ip), port)
    return SocketAddress(socket.inet_ntop(socket.AF_INET6, ip), port)
