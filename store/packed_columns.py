"""Packed columns: big lists inside the JSON state files, compact and cheap.

A state file may list a million leases or timers. As JSON rows (a list per
item) that is tens of megabytes, and encoding it holds the interpreter for
seconds: the node's event loop stalls, heartbeats stop, and followers elect
a new leader. Packed, a column of integers is little-endian int64s (each the
difference from the one before, for a column that mostly rises), deflated,
in base64: a column of a million consecutive offsets packs into 57 KB,
and every step runs in C in well under a tenth of a second.
"""
from __future__ import annotations

import base64
import json
import operator
import sys
import zlib
from array import array
from itertools import accumulate
from typing import Any, Sequence

from store.slices import breathe

# Fast deflate: the columns are mostly small repeated differences, which even
# the fastest level shrinks about thirtyfold.
_LEVEL = 1


_SLICE = 65_536


def pack_ints(values: Sequence[int], delta: bool = False) -> str:
    # By slices, as unpack_ints: one C call over a million values (the
    # differences, the array) held the GIL for 30-100 ms, and with it the
    # event loop while a worker thread encoded a snapshot.
    column = array("q")
    previous = 0
    for start in range(0, len(values), _SLICE):
        part = values[start:start + _SLICE]
        if delta and part:
            part, previous = list(map(operator.sub, part, [previous, *part[:-1]])), part[-1]
        column.extend(part)
        breathe()
    if sys.byteorder == "big":
        column.byteswap()
    return _deflate(column.tobytes())


def unpack_ints(text: str, count: int, delta: bool = False) -> list[int]:
    """The column `pack_ints` made; ValueError when it does not hold `count` values."""
    column = array("q")
    try:
        column.frombytes(_inflate(text))
    except ValueError as error:
        raise ValueError(f"a packed column is not whole int64s: {error}") from None
    if sys.byteorder == "big":
        column.byteswap()
    if len(column) != count:
        raise ValueError(f"a packed column holds {len(column)} values, not {count}")
    # By slices: each C call then holds the GIL for milliseconds, so the
    # event loop keeps running while a worker thread decodes a big column.
    values: list[int] = []
    total = 0
    for start in range(0, count, _SLICE):
        part = column[start:start + _SLICE].tolist()
        if delta:
            part = list(accumulate(part, initial=total))[1:]
            total = part[-1] if part else total
        values.extend(part)
        breathe()
    return values


def pack_json(value: Any) -> str:
    """A column of strings (or anything JSON), deflated."""
    return _deflate(json.dumps(value, separators=(",", ":")).encode("utf-8"))


def unpack_json(text: str) -> Any:
    return json.loads(_inflate(text))


def _deflate(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, _LEVEL)).decode("ascii")


def _inflate(text: str) -> bytes:
    try:
        return zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (zlib.error, ValueError, UnicodeEncodeError) as error:
        raise ValueError(f"a packed column is damaged: {error}") from None
