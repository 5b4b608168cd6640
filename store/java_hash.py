"""Java's String.hashCode, as RocketMQ stores it on disk.

ConsumeQueue units carry the tag's hash code and IndexFile items the key's;
a broker filtering by tag or a query by key only works if these are the very
numbers Java computes, so they are reproduced exactly: 31-polynomial over the
UTF-16 code units (surrogate pairs for characters outside the BMP), wrapping
at 32 bits, signed.
"""
from __future__ import annotations

import operator
import struct

_MASK32 = 0xFFFFFFFF
# 31**k mod 2**32, highest power first: the hash of n units is the dot product
# of the units with the last n powers, taken mod 2**32 (the same wrap as
# Java's int arithmetic), computed in C by sum(map(...)) instead of a Python
# loop per character. Longer strings fall back to Horner's rule.
_POWERS_LENGTH = 512
_POWERS = [pow(31, k, 1 << 32) for k in range(_POWERS_LENGTH - 1, -1, -1)]


def java_string_hash(text: str) -> int:
    """String.hashCode(): a signed 32-bit int."""
    if text.isascii():
        units: bytes | tuple[int, ...] = text.encode("ascii")
    else:
        encoded = text.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(encoded) // 2}H", encoded)
    n = len(units)
    if n <= _POWERS_LENGTH:
        h = sum(map(operator.mul, units, _POWERS[_POWERS_LENGTH - n:])) & _MASK32
    else:
        h = 0
        for unit in units:
            h = (31 * h + unit) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def tag_hash_code(tag: str | None) -> int:
    """The tags code of a ConsumeQueue unit (MessageExtBrokerInner.tagsString2tagsCode):
    the tag's hashCode widened to a Java long (so it may be negative); 0 for no tag."""
    if not tag:
        return 0
    return java_string_hash(tag)


def index_key_hash(key: str) -> int:
    """IndexFile's key hash (indexKeyHashMethod): |hashCode|, and 0 for
    Integer.MIN_VALUE, whose absolute value does not fit in an int."""
    h = java_string_hash(key)
    if h == -(1 << 31):
        return 0
    return -h if h < 0 else h
