"""DLedgerEntry and its byte codec: DLedger's 48-byte big-endian header.

Data entry layout (offsets in bytes):

    0  magic      int32   1 NORMAL, 2 NOOP, 4 PRODUCER_MARK, -1 BLANK (segment-end padding)
    4  size       int32   whole entry, header included (48 + body)
    8  index      int64
   16  term       int64
   24  pos        int64   absolute data-file offset of this entry
   32  channel    int32   who wrote the entry: 0 a log client (Append RPC),
                          1 the state machine embedded in the node (the
                          message store); DLedger reserves it, always 0
   36  chain_crc  uint32  see below
   40  body_crc   uint32  zlib.crc32 of the body
   44  body_size  int32
   48  body

DLedger reserves both CRC fields but never fills them. We do:
- body_crc = crc32(body) detects a torn or flipped body;
- chain_crc = crc32(header[0:36] + body_crc, previous entry's chain_crc)
  covers the header fields and links each entry to the whole history before it,
  so two replicas whose last chain CRCs agree hold the same log.

Index record (32 bytes, at index * 32 of the index files):
    magic int32 | pos int64 | size int32 | index int64 | term int64
"""
from __future__ import annotations

import struct
import zlib
from typing import Iterator, NamedTuple

from dledger.errors import CorruptLogError

MAGIC_NORMAL = 1
MAGIC_NOOP = 2
MAGIC_CONFIG_CHANGE = 3  # reserved, as in DLedger
# Ours: written by the leader after the entries of an idempotent append, naming
# (producer id, sequence, count) so that every replica can recognise a retry
# (dledger/producer_table.py). Its own magic, rather than a flag in the body,
# lets the apply step find marks from the 32-byte index records alone.
MAGIC_PRODUCER_MARK = 4
MAGIC_BLANK = -1
VALID_MAGICS = (MAGIC_NORMAL, MAGIC_NOOP, MAGIC_CONFIG_CHANGE, MAGIC_PRODUCER_MARK)
# Entries that clients appended, as opposed to the log's own bookkeeping.
USER_MAGICS = (MAGIC_NORMAL,)

# The header's channel: set by the leader's write path, covered by the chain
# CRC, and not settable through the Append RPC, so a state machine applies
# only what it wrote itself and no log client can forge its entries.
CHANNEL_LOG_API = 0
CHANNEL_STATE_MACHINE = 1

HEADER = struct.Struct(">iiqqqiIIi")
HEADER_SIZE = HEADER.size  # 48
CHAIN_PREFIX_SIZE = 36     # magic .. channel: the bytes the chain CRC covers
BLANK = struct.Struct(">ii")
MIN_BLANK_LEN = 8          # an entry goes in a segment only if 8 bytes stay free after it

INDEX_RECORD = struct.Struct(">iqiqq")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 32

_CRC_BYTES = struct.Struct(">I")

assert HEADER_SIZE == 48 and INDEX_RECORD_SIZE == 32


class DLedgerEntry(NamedTuple):
    # A NamedTuple, not a frozen dataclass: as immutable, and made in a fifth
    # of the time (a frozen dataclass sets each field through
    # object.__setattr__), which counts on every read of an entry.
    index: int
    term: int
    pos: int
    magic: int
    body: bytes
    body_crc: int
    chain_crc: int
    channel: int = CHANNEL_LOG_API

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.body)


class EntryHeader(NamedTuple):
    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int


def chain_crc_of(header_prefix: bytes | memoryview, body_crc: int, previous_chain_crc: int) -> int:
    """The chain CRC of an entry whose first 36 header bytes are `header_prefix`."""
    crc = zlib.crc32(header_prefix, previous_chain_crc)
    return zlib.crc32(_CRC_BYTES.pack(body_crc), crc)


def encode_entry(index: int, term: int, pos: int, body: bytes, previous_chain_crc: int,
                 magic: int = MAGIC_NORMAL, channel: int = CHANNEL_LOG_API) -> tuple[bytes, int]:
    """Encode one entry; returns (bytes, its chain CRC)."""
    size = HEADER_SIZE + len(body)
    body_crc = zlib.crc32(body)
    buf = bytearray(size)
    HEADER.pack_into(buf, 0, magic, size, index, term, pos, channel, 0, body_crc, len(body))
    chain = chain_crc_of(memoryview(buf)[:CHAIN_PREFIX_SIZE], body_crc, previous_chain_crc)
    _CRC_BYTES.pack_into(buf, 36, chain)
    buf[HEADER_SIZE:] = body
    return bytes(buf), chain


def decode_header(buf: bytes | memoryview, offset: int = 0) -> EntryHeader:
    return EntryHeader._make(HEADER.unpack_from(buf, offset))


def verify_entry(buf: bytes | memoryview, offset: int, previous_chain_crc: int | None) -> EntryHeader:
    """Check one encoded entry at `offset` and return its header.

    Raises CorruptLogError naming what failed. `previous_chain_crc` None skips
    the chain link check (used when the previous entry is not at hand)."""
    if len(buf) - offset < HEADER_SIZE:
        raise CorruptLogError(f"entry at offset {offset}: only {len(buf) - offset} bytes, header needs 48")
    h = decode_header(buf, offset)
    if h.magic not in VALID_MAGICS:
        raise CorruptLogError(f"entry at offset {offset}: bad magic {h.magic}")
    if h.size != HEADER_SIZE + h.body_size or h.body_size < 0:
        raise CorruptLogError(f"entry {h.index}: size {h.size} does not match body size {h.body_size}")
    end = offset + h.size
    if end > len(buf):
        raise CorruptLogError(f"entry {h.index}: truncated, {len(buf) - offset} of {h.size} bytes present")
    mv = memoryview(buf)
    body_crc = zlib.crc32(mv[offset + HEADER_SIZE:end])
    if body_crc != h.body_crc:
        raise CorruptLogError(f"entry {h.index}: body CRC {body_crc:#010x} != stored {h.body_crc:#010x}")
    if previous_chain_crc is not None:
        chain = chain_crc_of(mv[offset:offset + CHAIN_PREFIX_SIZE], h.body_crc, previous_chain_crc)
        if chain != h.chain_crc:
            raise CorruptLogError(f"entry {h.index}: chain CRC {chain:#010x} != stored {h.chain_crc:#010x}")
    return h


def verified_prefix(buf: bytes | memoryview, first_index: int, count: int, previous_chain_crc: int
                    ) -> tuple[int, int]:
    """How many of the `count` back-to-back entries in `buf` (from
    `first_index`) pass every check of verify_entry and follow on from
    `previous_chain_crc`, and the chain CRC after them. The scrubber's loop:
    the same checks with no object per entry (it re-reads the whole log at
    a steady rate); verify_entry on the first failing entry says what failed."""
    mv = memoryview(buf)
    unpack, crc32, pack_crc = HEADER.unpack_from, zlib.crc32, _CRC_BYTES.pack
    end, at, chain = len(buf), 0, previous_chain_crc
    for i in range(count):
        if end - at < HEADER_SIZE:
            return i, chain
        magic, size, index, _, _, _, chain_crc, body_crc, body_size = unpack(buf, at)
        if (magic not in VALID_MAGICS or body_size < 0 or size != HEADER_SIZE + body_size or at + size > end
                or index != first_index + i or crc32(mv[at + HEADER_SIZE:at + size]) != body_crc
                or crc32(pack_crc(body_crc), crc32(mv[at:at + CHAIN_PREFIX_SIZE], chain)) != chain_crc):
            return i, chain
        chain, at = chain_crc, at + size
    return count, chain


def iter_entries(buf: bytes | memoryview, previous_chain_crc: int | None) -> Iterator[tuple[int, EntryHeader]]:
    """Walk back-to-back verified entries in `buf`, yielding (offset, header)."""
    offset = 0
    chain = previous_chain_crc
    while offset < len(buf):
        h = verify_entry(buf, offset, chain)
        yield offset, h
        chain = h.chain_crc
        offset += h.size


def entry_from_bytes(buf: bytes | memoryview, offset: int = 0) -> DLedgerEntry:
    h = verify_entry(buf, offset, None)
    body = bytes(memoryview(buf)[offset + HEADER_SIZE:offset + h.size])
    return DLedgerEntry(h.index, h.term, h.pos, h.magic, body, h.body_crc, h.chain_crc, h.channel)


def encode_index_record(magic: int, pos: int, size: int, index: int, term: int) -> bytes:
    return INDEX_RECORD.pack(magic, pos, size, index, term)


def run_indexes(records: bytes) -> tuple[int, int]:
    """The first and last entry index that a run of index records (a raw
    read's `raw_records`) names."""
    last = len(records) - INDEX_RECORD_SIZE
    return INDEX_RECORD.unpack_from(records, 0)[3], INDEX_RECORD.unpack_from(records, last)[3]
