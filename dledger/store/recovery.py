"""Recovery: where the log on disk really ends, and whether that end is safe.

At start-up the file store (file_store.py) picks where to begin (after the
checkpoint's end entry when it checks out, else the first segment) and then:

1. `LogScanner.scan` walks the data forward, checking every entry (magic,
   size, index, term, position, body CRC, chain CRC), rewrites index records
   that disagree with the data (one pwrite per run), and stops at a clean end
   or at the first bad entry;
2. `judge` (a plain function: no files) decides what that stop means. A bad
   entry past everything the node flushed and committed is a torn tail, a
   write a crash cut short: cut it. A bad entry at or below that point, or one
   followed by a valid entry (written whole, then damaged), or a log shorter
   than the checkpoint says, is damage to data the node may have acknowledged:
   the store refuses to open, or cuts the log and repairs it from the leader
   (see DLedgerServer and docs/log.md, "Damaged replicas repair themselves").

The store then applies the verdict: it cuts the files and sets its indexes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from dledger.entry import (BLANK, HEADER_SIZE, INDEX_RECORD, INDEX_RECORD_SIZE, MAGIC_BLANK, MIN_BLANK_LEN,
                           VALID_MAGICS, EntryHeader, verify_entry)
from dledger.errors import CorruptLogError
from dledger.store.checkpoint import Checkpoint
from dledger.store.segment_list import SegmentList

log = logging.getLogger(__name__)

# The scan reads data in chunks of this size (or one whole entry when larger).
SCAN_CHUNK_BYTES = 4 << 20


@dataclass
class ScanStart:
    offset: int
    next_index: int | None          # None: whatever the first entry found says
    previous_chain_crc: int | None  # None: do not check the first entry's link
    previous_term: int


@dataclass
class ScanResult:
    end_offset: int          # where the valid log ends (the next entry would start here)
    last_index: int | None   # None when nothing was scanned and nothing was known before
    last_term: int
    last_chain_crc: int
    first_index: int | None  # first entry the scan itself read
    failure: str             # "" when the scan reached a clean end
    # The bad entry is whole and a valid entry follows it: damage to data
    # that was written and synced, not a write a crash cut short.
    damaged: bool = False


@dataclass
class Verdict:
    """What the scan's end means: the log is [begin_index, end_index]; and
    either it ended cleanly, or a torn tail is cut (`torn_tail` says what was
    wrong), or entries from `damaged_index` on are damaged (`damage`)."""
    begin_index: int
    end_index: int
    torn_tail: str = ""
    damaged_index: int = -1
    damage: CorruptLogError | None = None


def judge(result: ScanResult, checkpoint: Checkpoint | None, from_log_start: bool) -> Verdict:
    """Torn tail or damage? Damage is anything at or below what the node
    flushed or committed (it may have acknowledged it), or a bad entry that a
    valid one follows. Raises when entries before the scan's start are
    missing: nothing can be repaired below the log's begin."""
    committed = checkpoint.committed_index if checkpoint else -1
    flushed_position = checkpoint.flushed_position if checkpoint else 0
    if checkpoint is not None:
        begin = checkpoint.begin_index
        if from_log_start and result.first_index is not None and result.first_index > begin:
            raise CorruptLogError(f"the log starts at entry {result.first_index} but the checkpoint "
                                  f"says it begins at {begin}: entries are missing")
    else:
        begin = result.first_index if result.first_index is not None else 0
    end_index = result.last_index if result.last_index is not None else begin - 1
    verdict = Verdict(begin, end_index)
    if result.failure:
        failed_index = end_index + 1
        below_flushed = failed_index <= committed or result.end_offset < flushed_position
        if below_flushed or result.damaged:
            verdict.damaged_index = failed_index
            verdict.damage = CorruptLogError(
                f"entry {failed_index} at pos {result.end_offset}: {result.failure}; "
                + (f"it is below the committed/flushed point (committed {committed}, "
                   f"flushed up to pos {flushed_position})" if below_flushed
                   else "a valid entry follows it, so it was written whole and then damaged"))
        else:
            verdict.torn_tail = result.failure
    elif end_index < committed or result.end_offset < flushed_position:
        verdict.damaged_index = end_index + 1
        verdict.damage = CorruptLogError(
            f"the log ends at entry {end_index} (pos {result.end_offset}) but the checkpoint says entries up "
            f"to {committed} are committed and data is flushed up to pos {flushed_position}")
    return verdict


class LogScanner:
    """Reads the log's data and index segments for recovery."""

    def __init__(self, data: SegmentList, index: SegmentList, max_entry_size: int) -> None:
        self._data = data
        self._index = index
        self._max_entry_size = max_entry_size

    def scan(self, start: ScanStart, known: tuple[int, int, int] | None, min_repair_index: int) -> ScanResult:
        """Walk entries forward from `start`, checking each, rewriting index records
        that disagree with the data, until a clean end or the first bad entry.
        `known`: (index, term, chain CRC) of the entry before `start`, if any."""
        offset = start.offset
        expected = start.next_index
        chain = start.previous_chain_crc
        last_term = start.previous_term
        last_index, last_chain = (known[0], known[2]) if known else (None, 0)
        first_index: int | None = None
        repairs = IndexRepairs(self._index, min_repair_index)

        def result(failure: str, damaged: bool = False) -> ScanResult:
            repairs.apply()
            return ScanResult(offset, last_index, last_term, last_chain, first_index, failure, damaged)

        while True:
            segment = self._data.find(offset)
            if segment is None:
                return result("")
            relative = offset - segment.start
            if segment.end - offset < MIN_BLANK_LEN:
                return result(f"{segment.end - offset} bytes left at the segment end, no BLANK record")
            magic, size = BLANK.unpack_from(segment.read(relative, MIN_BLANK_LEN))
            if magic == 0 and size == 0:
                return result("")
            if magic == MAGIC_BLANK:
                leading = offset == self._data.first_start
                if size < MIN_BLANK_LEN or offset + size > segment.end or not (leading or offset + size == segment.end):
                    return result(f"bad BLANK record of size {size}")
                offset += size
                continue
            if magic not in VALID_MAGICS:
                return result(f"bad magic {magic}")
            if size < HEADER_SIZE or size + MIN_BLANK_LEN > segment.end - offset:
                return result(f"size {size} does not fit in the segment")
            chunk = segment.read(relative, min(max(SCAN_CHUNK_BYTES, size), segment.end - offset - MIN_BLANK_LEN))
            at = 0
            while at + MIN_BLANK_LEN <= len(chunk):
                magic, size = BLANK.unpack_from(chunk, at)
                if magic not in VALID_MAGICS:
                    break  # end, BLANK or damage: the outer loop looks at it
                if at + size > len(chunk):
                    break  # continues in the next chunk
                try:
                    header = verify_entry(chunk, at, chain)
                except CorruptLogError as e:
                    return result(e.message, self._followed_by_an_entry(offset, size, expected))
                problem = scan_problem(header, offset, expected, last_term)
                if problem:
                    return result(problem)
                repairs.add(header)
                if first_index is None:
                    first_index = header.index
                chain = last_chain = header.chain_crc
                last_index, last_term, expected = header.index, header.term, header.index + 1
                offset += header.size
                at += header.size
            repairs.apply()

    def _followed_by_an_entry(self, offset: int, size: int, index: int | None) -> bool:
        """Does a valid entry (the next index) start right after the bad one at
        `offset`? A write a crash cut short leaves nothing valid after it in
        practice (the flush covers every entry before the one it reports), so
        this tells a flipped bit in synced data from a torn tail."""
        try:
            head = self._data.read_across(offset + size, HEADER_SIZE)
            magic, entry_size = BLANK.unpack_from(head, 0)
            if magic not in VALID_MAGICS or entry_size < HEADER_SIZE or entry_size > self._max_entry_size + 64:
                return False
            header = verify_entry(self._data.read_across(offset + size, entry_size), 0, None)
        except CorruptLogError:
            return False
        return index is None or header.index == index + 1

    def last_index_record(self) -> tuple[int, int]:
        """The (index, term) of the last record in the index files: the last
        entry this node ever appended, so at least everything it ever
        acknowledged. (-1, -1) without records."""
        for segment in reversed(self._index.segments):
            end = segment.size
            while end > 0:
                start = max(0, end - (1 << 20))
                chunk = segment.read(start, end - start)
                stripped = len(chunk.rstrip(b"\0"))
                if stripped:
                    at = (stripped - 1) // INDEX_RECORD_SIZE * INDEX_RECORD_SIZE
                    record = INDEX_RECORD.unpack_from(chunk, at)
                    return record[3], record[4]
                end = start
        return -1, -1


class IndexRepairs:
    """Index records recovery derives from the data, compared with what the index
    files hold and rewritten (one pwrite per run) where they differ."""

    def __init__(self, index: SegmentList, min_index: int) -> None:
        self._index = index
        self._min_index = min_index
        self._first: int | None = None
        self._records = bytearray()

    def add(self, header: EntryHeader) -> None:
        if header.index < self._min_index:
            return
        if self._first is None:
            self._first = header.index
        self._records += INDEX_RECORD.pack(header.magic, header.pos, header.size, header.index, header.term)

    def apply(self) -> None:
        if self._first is None:
            return
        offset = self._first * INDEX_RECORD_SIZE
        first_start = self._index.first_start
        records = memoryview(self._records)
        if first_start is not None and offset < first_start:
            # Records below the first index segment belong to deleted history.
            skip = min(len(records), first_start - offset)
            records, offset = records[skip:], offset + skip
        if records and self._index.read_across(offset, len(records)) != records:
            log.warning("rewriting index records %d..%d from the data", offset // INDEX_RECORD_SIZE,
                        (offset + len(records)) // INDEX_RECORD_SIZE - 1)
            self._index.ensure(offset, offset + len(records))
            self._index.write(offset, records)
        self._first = None
        self._records = bytearray()


def scan_problem(header: EntryHeader, offset: int, expected: int | None, last_term: int) -> str:
    """Why an entry whose CRCs check out still does not belong where it lies."""
    index, term, pos = header.index, header.term, header.pos
    if expected is not None and index != expected:
        return f"index {index} where {expected} was expected"
    if term < last_term:
        return f"term {term} below the previous term {last_term}"
    if pos != offset:
        return f"pos field {pos} but the entry lies at {offset}"
    return ""
