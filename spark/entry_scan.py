"""Walking the committed entries of a FileRange, every CRC checked.

This runs on executors. It reads the segment with large preads (the page
cache does the rest) and hands out memoryview slices of each chunk, so a body
is copied once, into Arrow. It never reads past last_index, which is how an
uncommitted tail, or stale bytes left behind a truncation, stay unread.
"""
from __future__ import annotations

import os
import zlib
from typing import Iterator

from dledger.entry import CHANNEL_STATE_MACHINE, HEADER, HEADER_SIZE, MAGIC_BLANK, MAGIC_NORMAL, VALID_MAGICS
from spark.log_files import LogFilesError
from spark.partitions import FileRange

# Bytes per pread: large enough that the per-call cost vanishes, small enough
# that a task's memory stays modest.
CHUNK_BYTES = 8 << 20
_HEADER_PREFIX = 36  # the header bytes the chain CRC covers (dledger/entry.py)


# (index, term, pos, magic, body): a plain tuple, built once per entry on the hot path.
ScannedEntry = tuple[int, int, int, int, memoryview]

# The magic handed on for a NORMAL entry a log client appended (header channel
# CHANNEL_LOG_API): whatever its body looks like, it is a raw row, never a
# message or system row (store/reput.py applies such entries the same way).
MAGIC_CLIENT_NORMAL = 1001


def scanned_magic(magic: int, channel: int) -> int:
    return MAGIC_CLIENT_NORMAL if magic == MAGIC_NORMAL and channel != CHANNEL_STATE_MACHINE else magic


def scan_file_range(part: FileRange) -> Iterator[ScannedEntry]:
    """Entries part.first_index..part.last_index, in order, or LogFilesError."""
    with open(part.path, "rb") as f:
        position = part.pos if part.pos is not None else _first_pos(f.fileno(), part)
        yield from _walk(f.fileno(), part, position)


def _first_pos(fd: int, part: FileRange) -> int:
    """Where entry first_index starts when no index file said so: walk headers."""
    for index, pos, _ in _headers(fd, part):
        if index == part.first_index:
            return pos
        if index > part.first_index:
            break
    raise LogFilesError(f"{part.path}: entry {part.first_index} is not in this segment")


def _headers(fd: int, part: FileRange) -> Iterator[tuple[int, int, int]]:
    """(index, pos, size) of each entry of the segment, from its headers alone."""
    at = 0
    while at + HEADER_SIZE <= part.segment_size:
        magic, size, index = HEADER.unpack(os.pread(fd, HEADER_SIZE, at))[:3]
        if magic == MAGIC_BLANK and at == 0:
            at = size
            continue
        if magic not in VALID_MAGICS:
            return
        yield index, part.segment_start + at, size
        at += size


def _walk(fd: int, part: FileRange, position: int) -> Iterator[ScannedEntry]:
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    chain = part.previous_chain_crc
    expected = part.first_index
    relative = position - part.segment_start
    while expected <= part.last_index:
        length = min(CHUNK_BYTES, part.segment_size - relative)
        chunk = os.pread(fd, length, relative)
        view = memoryview(chunk)
        at = 0
        while expected <= part.last_index and at + HEADER_SIZE <= len(chunk):
            magic, size, index, term, pos, channel, chain_crc, body_crc, body_size = unpack(chunk, at)
            if magic not in VALID_MAGICS or size != HEADER_SIZE + body_size or body_size < 0:
                raise _damaged(part, expected, relative + at, f"no entry header (magic {magic}, size {size})")
            if at + size > len(chunk):
                if at == 0:  # larger than a chunk and still not whole: the file ends early
                    raise _damaged(part, expected, relative, f"entry of {size} bytes runs past the segment")
                break
            if index != expected or pos != part.segment_start + relative + at:
                raise _damaged(part, expected, relative + at, f"found entry {index} claiming pos {pos}")
            body = view[at + HEADER_SIZE:at + size]
            if crc32(body) != body_crc:
                raise _damaged(part, index, relative + at, "body CRC mismatch")
            if chain is not None and \
                    crc32(view[at + 40:at + 44], crc32(view[at:at + _HEADER_PREFIX], chain)) != chain_crc:
                raise _damaged(part, index, relative + at, "chain CRC mismatch: it does not follow the entry before")
            chain = chain_crc
            yield index, term, pos, (MAGIC_CLIENT_NORMAL if magic == MAGIC_NORMAL and channel != CHANNEL_STATE_MACHINE
                                     else magic), body
            expected += 1
            at += size
        if at == 0 and expected <= part.last_index:
            raise _damaged(part, expected, relative, "the segment ends before the committed entries do")
        relative += at


def _damaged(part: FileRange, index: int, relative: int, what: str) -> LogFilesError:
    return LogFilesError(f"{part.path} at offset {relative}, entry {index}: {what}")


def raw_read_bytes(path: str, chunk_bytes: int = CHUNK_BYTES, limit: int | None = None) -> int:
    """Read a file (at most `limit` bytes) with the same preads and nothing
    else: the speed limit a replay of it can approach (bench/replay.py)."""
    total = 0
    with open(path, "rb") as f:
        while limit is None or total < limit:
            want = chunk_bytes if limit is None else min(chunk_bytes, limit - total)
            chunk = os.pread(f.fileno(), want, total)
            if not chunk:
                break
            total += len(chunk)
    return total
