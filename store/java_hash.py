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
from typing import Sequence

import numpy as np

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


# A run of keys hashed at once with NumPy instead of a sum per key: below
# this many keys the per-key sum is cheaper than NumPy's fixed cost.
_VECTOR_MIN_KEYS = 8
_INVERSE_31 = pow(31, -1, 1 << 32)   # 31 is odd, so it has an inverse mod 2**32
_power_tables: tuple[np.ndarray, np.ndarray] = (np.ones(1, np.uint32), np.ones(1, np.uint32))


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """31**j and 31**-j mod 2**32 for j < n (at least), as uint32 arrays;
    the tables grow by doubling, so their one Python loop is paid rarely."""
    global _power_tables
    if len(_power_tables[0]) < n:
        size = max(n, 2 * len(_power_tables[0]), 4096)
        forward, inverse = [1] * size, [1] * size
        for j in range(1, size):
            forward[j] = forward[j - 1] * 31 & _MASK32
            inverse[j] = inverse[j - 1] * _INVERSE_31 & _MASK32
        _power_tables = np.array(forward, np.uint32), np.array(inverse, np.uint32)
    return _power_tables


def index_key_hashes(keys: Sequence[str]) -> list[int]:
    """index_key_hash of every key, for a run of keys at once."""
    if len(keys) < _VECTOR_MIN_KEYS:
        return [index_key_hash(k) for k in keys]
    joined = "".join(keys)
    if not joined.isascii():
        return [index_key_hash(k) for k in keys]   # UTF-16 units: rare, kept exact by the scalar path
    units = np.frombuffer(joined.encode("ascii"), np.uint8).astype(np.uint32)
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    ends = np.cumsum(lengths)
    forward, inverse = _powers(len(units) + 1)
    # h(key) = sum of unit[j] * 31**(end-1-j) = 31**(end-1) * (S[end] - S[start]),
    # S the running sum of unit[j] * 31**-j: every step wraps mod 2**32 as Java's int does.
    running = np.zeros(len(units) + 1, np.uint32)
    np.cumsum(units * inverse[:len(units)], dtype=np.uint32, out=running[1:])
    hashes = (running[ends] - running[ends - lengths]) * forward[np.maximum(ends - 1, 0)]
    signed = hashes.view(np.int32).astype(np.int64)
    absolute = np.abs(signed)
    absolute[absolute == 1 << 31] = 0   # Integer.MIN_VALUE has no absolute value
    return absolute.tolist()
