"""DLedgerFileStore: the replicated log on disk (DLedger's DLedgerMmapFileStore).

Layout under `<data_dir>/dledger-<self_id>/`:
    data/        fixed-size segments of back-to-back entries (48-byte header + body)
    index/       fixed-size segments of 32-byte records; entry i's record is at i*32
    checkpoint   Java properties: committedIndex, endIndex, flushedPosition,
                 beginIndex, beforeBeginTerm, beforeBeginChainCrc

An entry goes into the current data segment only when its size plus
MIN_BLANK_LEN fits in what is left; otherwise the rest of the segment becomes a
BLANK record and the entry starts the next segment. The rule is deterministic,
so a follower appending the leader's entries gets the leader's positions, and
the store insists on it (pos must match), keeping replicas byte-identical.

All writes happen on the caller's thread (the event loop): pwrite into the page
cache is cheap. Only fdatasync goes to the store's single flush thread.

Beside this file: checkpoint.py (the checkpoint file and what keeps a stale
one from landing), recovery.py (the scan at start-up and the verdict on
where it stopped: torn tail or damage), segment_list.py (the files).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import time
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from dledger.config import DLedgerConfig
from dledger.entry import (
    BLANK,
    CHANNEL_LOG_API,
    HEADER,
    HEADER_SIZE,
    INDEX_RECORD,
    INDEX_RECORD_SIZE,
    MAGIC_BLANK,
    MAGIC_CONFIG_CHANGE,
    MAGIC_NORMAL,
    MIN_BLANK_LEN,
    VALID_MAGICS,
    DLedgerEntry,
    entry_from_bytes,
    verified_prefix,
    verify_entry,
)
from dledger import failpoints
from dledger.errors import CorruptLogError, DLedgerError, ResponseCode
from dledger.store.checkpoint import Checkpoint, CheckpointFile
from dledger.store.recovery import SCAN_CHUNK_BYTES, LogScanner, ScanResult, ScanStart, judge
from dledger.store.segment import Segment
from dledger.store.segment_list import (ZERO_FILL_BYTES, DirtyState, FsyncError, SegmentList, delete_segments,
                                       sync_dirty)

log = logging.getLogger(__name__)

# Called with the positions of the entries about to be written (see append_as_leader).
AppendHook = Callable[[list[int]], None]

_CRC = struct.Struct(">I")
_MAGIC = struct.Struct(">i")
_HEADER_CRC_FIELD = 36   # chain_crc lives at [36, 40), body_crc at [40, 44)
# After an ENOSPC the log stays read-only until this much more than the
# failed write is free, so that it does not flap between full and not full.
DISK_FULL_MARGIN = 4 << 20
CHECKPOINT_ROOM = 64 << 10   # a checkpoint file, its temp copy and directory blocks


@dataclass(frozen=True)
class RawRunPlan:
    """A run of back-to-back entries: their index records, and where their
    bytes lie (`length` bytes at `offset` of `segment`'s file)."""
    records: bytes
    segment: Segment
    offset: int
    length: int
    count: int


class DLedgerFileStore:
    def __init__(self, config: DLedgerConfig) -> None:
        self.config = config
        self.base_dir = os.path.join(config.data_dir, f"dledger-{config.self_id}")
        self.checkpoint = CheckpointFile(os.path.join(self.base_dir, "checkpoint"))
        self._data = SegmentList(os.path.join(self.base_dir, "data"), config.data_file_size, config.preallocate,
                                 config.self_id)
        self._index = SegmentList(os.path.join(self.base_dir, "index"), config.index_file_size,
                                  config.preallocate, config.self_id)
        self._scanner = LogScanner(self._data, self._index, config.max_entry_size)
        self.ledger_begin_index = 0
        self.ledger_end_index = -1
        self.ledger_end_term = 0
        self.ledger_end_chain_crc = 0
        # The entry just before the begin index (dropped by retention or by reset):
        # its term and chain CRC are what term_at/chain_crc_at answer for begin-1.
        self.before_begin_term = 0
        self.before_begin_chain_crc = 0
        self.flushed_index = -1
        self._flushed_position = 0
        self.committed_index = -1
        self.read_only_reason = ""
        # Set by open() when recovery cut the log at a damaged entry that was
        # at or below the flushed point: the node must repair (see DLedgerServer).
        self.damaged_from = -1
        self.acknowledged_end = -1
        # The term of the last entry this node held before the cut (at least):
        # with acknowledged_end, the log a repairing voter compares
        # candidates against (vote_rules.decide_vote).
        self.acknowledged_end_term = -1
        self._room_needed = 0   # bytes free needed to leave read-only after an ENOSPC
        self._read_only_logged_at = float("-inf")
        # Set when an fsync failed: the page cache can no longer be trusted
        # to reach the disk (Linux reports a failed writeback once, then
        # clears the error), so the store writes, flushes and acknowledges
        # nothing more and the node must stop (see on_fatal).
        self.failure = ""
        # Called once with the reason when the store fails; a node process
        # sets it to stop itself.
        self.on_fatal: Callable[[str], None] | None = None
        # Membership (dledger/membership.py) follows the configuration
        # entries through these: one is written (index, body), entries after
        # an index are dropped (truncate, reset).
        self.on_config_entry: Callable[[int, bytes], None] | None = None
        self.on_truncate: Callable[[int], None] | None = None
        self.fsync_count = 0  # flush rounds that went to the disk; group commit keeps it low
        self._executor: ThreadPoolExecutor | None = None
        self._flush_lock = asyncio.Lock()
        self._flush_requests = 0   # tickets handed to flush() callers
        self._flush_covered = 0    # every ticket <= this has had a flush start after it
        # Bumped by truncate/reset: a flush that ran across one must not claim
        # entries that were replaced meanwhile.
        self._epoch = 0

    @property
    def flushed_position(self) -> int:
        """The data position up to which fdatasync has returned."""
        return self._flushed_position

    @flushed_position.setter
    def flushed_position(self, position: int) -> None:
        self._flushed_position = position
        failpoints.record(failpoints.FLUSHED_POSITION, position)   # test harnesses only

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint.path

    @property
    def write_position(self) -> int:
        return self._data.write_position

    # ================================================================= open / close

    def open(self) -> None:
        os.makedirs(self.base_dir, exist_ok=True)
        self._data.load()
        self._index.load()
        checkpoint = self.checkpoint.read()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flush-{self.config.self_id}")
        try:
            self._recover(checkpoint)
            self.check_disk()
        except BaseException:
            # A store that refuses to open must not keep fds or a thread behind.
            self._executor.shutdown(wait=True)
            self._executor = None
            self._data.close()
            self._index.close()
            raise

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if not self.failure:
            # After a failed fsync a second one may report success for pages
            # that never reached the disk: no checkpoint may claim them.
            self._sync_everything()
            self.write_checkpoint()
        self._data.close()
        self._index.close()

    # ================================================================= leader

    def append_as_leader(self, bodies: Sequence[bytes], term: int, magic: int = MAGIC_NORMAL,
                         magics: Sequence[int] | None = None,
                         prepare: AppendHook | None = None,
                         channel: int = CHANNEL_LOG_API) -> list[tuple[int, int]]:
        """Write `bodies` as entries ledger_end_index+1.. of `term`; returns [(index, pos)].
        Every entry gets `magic`, or its own from `magics` when given. `prepare`
        is called with every entry's position once they are known and before
        anything is encoded, so it may fill position-derived fields into the
        bodies in place (DLedger's AppendHook: RocketMQ's physical offset); it
        must not change their sizes. `channel` goes into every header (see
        dledger/entry.py). One buffer, one pwrite per segment
        touched, one for the index records; no fsync."""
        self._check_writable()
        if term < self.ledger_end_term:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"term {term} is below the last entry's term {self.ledger_end_term}")
        if not bodies:
            return []
        start = self._data.write_position
        positions, blanks, end = self._plan_positions(start, bodies)
        if prepare is not None:
            sizes = [len(body) for body in bodies]
            prepare(positions)
            if [len(body) for body in bodies] != sizes:
                raise DLedgerError(ResponseCode.INTERNAL_ERROR, "an append hook changed the size of a body")
        buffer = bytearray(end - start)  # zeros: BLANK padding needs only its 8-byte header
        for blank_at in blanks:
            BLANK.pack_into(buffer, blank_at - start, MAGIC_BLANK, self._segment_end(blank_at) - blank_at)
        records = bytearray(INDEX_RECORD_SIZE * len(bodies))
        first_index = self.ledger_end_index + 1
        chain = self._encode_into(buffer, records, start, positions, bodies, first_index, term,
                                  magics if magics is not None else [magic] * len(bodies),
                                  self.ledger_end_chain_crc, channel)
        self._write(start, buffer, records)
        self._advance(first_index + len(bodies) - 1, term, chain)
        if self.on_config_entry is not None and (magic == MAGIC_CONFIG_CHANGE or
                                                 (magics is not None and MAGIC_CONFIG_CHANGE in magics)):
            for i, body in enumerate(bodies):
                if (magics[i] if magics is not None else magic) == MAGIC_CONFIG_CHANGE:
                    self.on_config_entry(first_index + i, bytes(body))
        return [(first_index + i, pos) for i, pos in enumerate(positions)]

    def _plan_positions(self, start: int, bodies: Sequence[bytes]) -> tuple[list[int], list[int], int]:
        """Apply the roll rule: returns each entry's pos, where BLANKs go, and the end offset."""
        segment_size = self._data.segment_size
        limit = self.config.max_entry_size
        pos = start
        segment_end = self._segment_end(start)
        positions: list[int] = []
        blanks: list[int] = []
        for body in bodies:
            size = HEADER_SIZE + len(body)
            if len(body) > limit or size + MIN_BLANK_LEN > segment_size:
                raise DLedgerError(ResponseCode.ENTRY_TOO_LARGE,
                                   f"entry body of {len(body)} bytes exceeds the limit of {limit} bytes")
            if size + MIN_BLANK_LEN > segment_end - pos:
                blanks.append(pos)
                pos = segment_end
                segment_end += segment_size
            positions.append(pos)
            pos += size
        return positions, blanks, pos

    @staticmethod
    def _encode_into(buffer: bytearray, records: bytearray, start: int, positions: list[int],
                     bodies: Sequence[bytes], first_index: int, term: int, magics: Sequence[int],
                     previous_chain_crc: int, channel: int) -> int:
        """Fill headers, bodies and index records; returns the last chain CRC.
        This is the leader's per-entry hot loop, so it avoids all allocation
        but the memoryview slices the CRCs need."""
        view = memoryview(buffer)
        pack_header = HEADER.pack_into
        pack_record = INDEX_RECORD.pack_into
        pack_crc = _CRC.pack_into
        crc32 = zlib.crc32
        chain = previous_chain_crc
        index = first_index
        record_at = 0
        for pos, body, magic in zip(positions, bodies, magics):
            at = pos - start
            body_size = len(body)
            size = HEADER_SIZE + body_size
            pack_header(buffer, at, magic, size, index, term, pos, channel, 0, crc32(body), body_size)
            chain = crc32(view[at + 40:at + 44], crc32(view[at:at + _HEADER_CRC_FIELD], chain))
            pack_crc(buffer, at + _HEADER_CRC_FIELD, chain)
            buffer[at + HEADER_SIZE:at + size] = body
            pack_record(records, record_at, magic, pos, size, index, term)
            record_at += INDEX_RECORD_SIZE
            index += 1
        return chain

    # ================================================================= follower

    def append_as_follower(self, data: bytes, first_index: int, count: int) -> int:
        """Write `count` entries encoded by the leader, back to back as they lie in one
        of its segments. Every check runs before any write; a failed check raises
        INCONSISTENT_STATE and leaves the store untouched. Returns the new end index."""
        self._check_writable()
        if first_index != self.ledger_end_index + 1:
            raise self._inconsistent(f"push starts at index {first_index}, "
                                     f"but this store's next index is {self.ledger_end_index + 1}")
        if count <= 0 or len(data) < HEADER_SIZE:
            raise self._inconsistent(f"push of {count} entries in {len(data)} bytes holds no entry")
        start = self._data.write_position
        segment_end = self._segment_end(start)
        first_size = BLANK.unpack_from(data, 0)[1]
        run_start = start
        if first_size + MIN_BLANK_LEN > segment_end - start:
            run_start = segment_end  # the leader rolled here too
            segment_end += self._data.segment_size
        if run_start + len(data) + MIN_BLANK_LEN > segment_end:
            raise self._inconsistent(f"push of {len(data)} bytes at pos {run_start} does not fit in one segment "
                                     f"(ends at {segment_end})")
        configs: list[tuple[int, int, int]] = []
        records, chain, last_term = self._verify_run(data, first_index, count, run_start, configs)
        self._write_follower_run(start, run_start, data, records)
        self._advance(first_index + count - 1, last_term, chain)
        if self.on_config_entry is not None:
            for index, at, size in configs:
                self.on_config_entry(index, bytes(data[at + HEADER_SIZE:at + size]))
        return self.ledger_end_index

    def _verify_run(self, data: bytes, first_index: int, count: int, run_start: int,
                    configs: list[tuple[int, int, int]]) -> tuple[bytearray, int, int]:
        """Check every entry of a push; returns (index records, last chain CRC, last term)
        and adds (index, offset, size) of each configuration entry to `configs`."""
        view = memoryview(data)
        unpack = HEADER.unpack_from
        pack_record = INDEX_RECORD.pack_into
        crc32 = zlib.crc32
        records = bytearray(INDEX_RECORD_SIZE * count)
        chain = self.ledger_end_chain_crc
        previous_term = self.ledger_end_term
        total = len(data)
        at = 0
        for i in range(count):
            expected = first_index + i
            if total - at < HEADER_SIZE:
                raise self._inconsistent(f"entry {expected}: push ends after {total} bytes, {i} of {count} entries")
            magic, size, index, term, pos, _, chain_crc, body_crc, body_size = unpack(data, at)
            if magic not in VALID_MAGICS or size != HEADER_SIZE + body_size or body_size < 0 or at + size > total:
                raise self._inconsistent(f"entry {expected}: bad header (magic {magic}, size {size}, "
                                         f"body size {body_size}, {total - at} bytes left)")
            if index != expected:
                raise self._inconsistent(f"entry at push offset {at} has index {index}, expected {expected}")
            if term < previous_term:
                raise self._inconsistent(f"entry {index}: term {term} is below the previous term {previous_term}")
            if pos != run_start + at:
                raise self._inconsistent(f"entry {index}: leader pos {pos}, but this store would write it at "
                                         f"{run_start + at}; the replicas would diverge")
            if crc32(view[at + HEADER_SIZE:at + size]) != body_crc:
                raise self._inconsistent(f"entry {index}: body CRC mismatch")
            chain = crc32(view[at + 40:at + 44], crc32(view[at:at + _HEADER_CRC_FIELD], chain))
            if chain != chain_crc:
                raise self._inconsistent(f"entry {index}: chain CRC {chain:#010x} != {chain_crc:#010x}; "
                                         f"it does not follow this store's entry {index - 1}")
            pack_record(records, i * INDEX_RECORD_SIZE, magic, pos, size, index, term)
            if magic == MAGIC_CONFIG_CHANGE:
                configs.append((index, at, size))
            previous_term = term
            at += size
        if at != total:
            raise self._inconsistent(f"push holds {total - at} bytes beyond its {count} entries")
        return records, chain, previous_term

    def _write_follower_run(self, start: int, run_start: int, data: bytes, records: bytearray) -> None:
        if run_start == start:
            self._write(start, data, records)
            return
        # The run opens a new segment: pad the old one first, as the leader did.
        blank = bytearray(run_start - start)
        BLANK.pack_into(blank, 0, MAGIC_BLANK, len(blank))
        self._write(start, blank, records, data)

    def _inconsistent(self, message: str) -> DLedgerError:
        return DLedgerError(ResponseCode.INCONSISTENT_STATE, message)

    # ================================================================= writing

    def _check_writable(self) -> None:
        self._check_not_failed()
        if self.read_only_reason:
            raise DLedgerError(ResponseCode.DISK_FULL, self.read_only_reason)

    def _segment_end(self, offset: int) -> int:
        return self._data.segment_start_of(offset) + self._data.segment_size

    def _write(self, start: int, data: bytes | bytearray, records: bytearray,
               more: bytes | None = None) -> None:
        """Write data (then `more` right after it) at `start` and the index records
        after the last one. All or nothing: on an I/O error the written bytes are
        zeroed again and the error becomes DISK_FULL / DISK_ERROR."""
        end = start + len(data) + (len(more) if more is not None else 0)
        record_start = (self.ledger_end_index + 1) * INDEX_RECORD_SIZE
        self._check_room_for_segments(end, record_start + len(records))
        try:
            # Create segments first: with preallocation that is where ENOSPC shows.
            self._data.ensure(start, end)
            self._index.ensure(record_start, record_start + len(records))
            self._data.write(start, data)
            if more is not None:
                self._data.write(start + len(data), more)
            self._index.write(record_start, records)
        except OSError as e:
            self._undo_write(start, end, record_start, len(records))
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(e, end - start) from e
            raise _disk_error(e) from e
        self._data.write_position = end
        self._index.write_position = record_start + len(records)

    def _undo_write(self, start: int, end: int, record_start: int, record_bytes: int) -> None:
        try:
            self._data.truncate(start, max(ZERO_FILL_BYTES, end - start))
            self._index.truncate(record_start, max(ZERO_FILL_BYTES, record_bytes))
        except OSError as e:
            # The in-memory end is unchanged, so these bytes are never read and
            # the next append overwrites them; recovery's chain check rejects
            # them unless they are the very entries that will be appended.
            log.error("could not zero a failed write at data pos %d, index record %d: %s",
                      start, record_start // INDEX_RECORD_SIZE, e)

    def _advance(self, end_index: int, term: int, chain_crc: int) -> None:
        self.ledger_end_index = end_index
        self.ledger_end_term = term
        self.ledger_end_chain_crc = chain_crc

    # ================================================================= truncate / reset

    def truncate(self, last_kept_index: int) -> None:
        """Drop every entry after last_kept_index; never a committed one."""
        if last_kept_index >= self.ledger_end_index:
            return
        if last_kept_index < self.committed_index:
            raise self._inconsistent(f"refusing to truncate after {last_kept_index}: "
                                     f"entries up to {self.committed_index} are committed")
        if last_kept_index < self.ledger_begin_index - 1:
            raise self._inconsistent(f"refusing to truncate after {last_kept_index}: "
                                     f"the log begins at {self.ledger_begin_index}")
        if last_kept_index == self.ledger_begin_index - 1:
            cut = self._record(self.ledger_begin_index)[1]
            term, chain = self.before_begin_term, self.before_begin_chain_crc
        else:
            entry = self._read_verified(last_kept_index)
            cut, term, chain = entry.pos + entry.size, entry.term, entry.chain_crc
        self._data.truncate(cut)
        self._index.truncate((last_kept_index + 1) * INDEX_RECORD_SIZE)
        self._advance(last_kept_index, term, chain)
        self._epoch += 1
        if self.on_truncate is not None:
            self.on_truncate(last_kept_index)
        if self.flushed_index > last_kept_index:
            self.flushed_index = last_kept_index
            self.flushed_position = cut
        # Checkpoints captured before the cut and still being written in the
        # flush thread are stale now: they would point past it.
        if self.checkpoint.invalidate(last_kept_index):
            # Recovery starts at the checkpoint's end entry; left pointing past
            # the cut it would resume inside the dropped suffix. The zeroed
            # bytes go to disk first so the dropped entries cannot reappear;
            # only what is dirty is synced (a truncate must not fsync every
            # segment of a large log on the event loop).
            self._sync(self._data.take_dirty())
            try:
                self.write_checkpoint()
            except DLedgerError:
                # Left in place it would point into the dropped entries; without
                # one, recovery scans the log from its first segment.
                self.checkpoint.remove()
                raise

    def reset(self, begin_index: int, begin_pos: int, before_begin_term: int,
              before_begin_chain_crc: int) -> None:
        """Discard the whole log and restart it empty, so that the next entry is
        begin_index at data position begin_pos (a follower behind the leader's begin)."""
        if self.committed_index >= begin_index:
            raise self._inconsistent(f"refusing to reset to begin {begin_index}: "
                                     f"entries up to {self.committed_index} are committed here")
        gap = begin_pos % self._data.segment_size
        if begin_index < 0 or begin_pos < 0 or 0 < gap < MIN_BLANK_LEN:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"cannot reset to index {begin_index} at pos {begin_pos}")
        self._epoch += 1
        self.ledger_begin_index = begin_index
        self.before_begin_term = before_begin_term
        self.before_begin_chain_crc = before_begin_chain_crc
        self._advance(begin_index - 1, before_begin_term, before_begin_chain_crc)
        if self.on_truncate is not None:
            self.on_truncate(begin_index - 1)
        self.flushed_index = begin_index - 1
        self.flushed_position = begin_pos
        # The checkpoint goes first: after a crash in the middle, recovery
        # finishes the reset from it (see _prepare_empty_log).
        self.checkpoint.write(self._checkpoint_now())
        self._data.delete_all()
        self._index.delete_all()
        self._install_begin_blank(begin_pos)
        self._data.truncate(begin_pos)
        self._index.write_position = begin_index * INDEX_RECORD_SIZE
        self._sync_everything()

    def _install_begin_blank(self, begin_pos: int) -> None:
        """Make `begin_pos` where the first entry goes: its segment exists and a
        BLANK record covers [segment start, begin_pos) (DLedger's startPosition),
        so a scan of the segment skips straight to begin_pos."""
        segment_start = self._data.segment_start_of(begin_pos)
        self._data.ensure(segment_start, segment_start + 1)
        if begin_pos > segment_start:
            blank = BLANK.pack(MAGIC_BLANK, begin_pos - segment_start)
            if self._data.read(segment_start, len(blank)) != blank:
                self._data.write(segment_start, blank)

    # ================================================================= reads

    def get(self, index: int) -> DLedgerEntry:
        self._check_range(index)
        return self._read_verified(index)

    def get_at_position(self, pos: int, size_hint: int | None = None) -> DLedgerEntry:
        """The entry whose header starts at data position `pos` (RocketMQ reads
        a message by its physical offset, pos + 48). CRC-checked; the caller
        decides whether the entry is committed. With `size_hint`, the entry's
        whole size as the caller expects it (a ConsumeQueue unit knows it), the
        entry is read with one pread instead of two; a wrong hint costs a
        second read, never a wrong answer."""
        segment = self._data.find(pos)
        if pos < 0 or pos >= self._data.write_position or segment is None or \
                pos + HEADER_SIZE > segment.end:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"no entry at position {pos}")
        usable_hint = size_hint is not None and HEADER_SIZE <= size_hint and pos + size_hint <= segment.end
        data = segment.read(pos - segment.start, size_hint if usable_hint else MIN_BLANK_LEN)  # type: ignore[arg-type]
        magic, size = BLANK.unpack_from(data)
        if magic not in VALID_MAGICS or size < HEADER_SIZE or pos + size > segment.end:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"position {pos} is not the start of an entry")
        if len(data) != size:
            data = segment.read(pos - segment.start, size)
        entry = entry_from_bytes(data)
        if entry.pos != pos or not self.ledger_begin_index <= entry.index <= self.ledger_end_index:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"position {pos} is not the start of a live entry")
        return entry

    def term_at(self, index: int) -> int:
        if index == self.ledger_end_index:
            return self.ledger_end_term
        if index == self.ledger_begin_index - 1:
            return self.before_begin_term
        if index == -1:
            return 0
        self._check_range(index)
        return self._record(index)[4]

    def position_of(self, index: int) -> int:
        self._check_range(index)
        return self._record(index)[1]

    def end_position_of(self, index: int) -> int:
        """Where the data of entry `index` ends (its pos + size); for the entry
        before the begin index, where the first retained entry starts."""
        if index == self.ledger_begin_index - 1:
            return self.position_of(index + 1) if self.ledger_end_index >= index + 1 else self.flushed_position
        self._check_range(index)
        _, pos, size, _, _ = self._record(index)
        return pos + size

    def chain_crc_at(self, index: int) -> int:
        if index == self.ledger_end_index:
            return self.ledger_end_chain_crc
        if index == self.ledger_begin_index - 1:
            return self.before_begin_chain_crc
        if index == -1:
            return 0
        self._check_range(index)
        _, pos, _, _, _ = self._record(index)
        header = HEADER.unpack(self._data_bytes(pos, HEADER_SIZE))
        if header[2] != index:
            raise CorruptLogError(f"entry {index}: data at pos {pos} holds entry {header[2]}")
        return header[6]

    def read_raw(self, start_index: int, max_bytes: int, max_count: int) -> tuple[bytes, int]:
        """Encoded entries from start_index, back to back inside one data segment:
        at most max_count and max_bytes, but at least one. (b"", 0) past the end.
        Not CRC-checked here: the follower checks every entry it receives."""
        _, data, count = self.read_raw_run(start_index, max_bytes, max_count)
        return data, count

    def read_raw_run(self, start_index: int, max_bytes: int, max_count: int) -> tuple[bytes, bytes, int]:
        """read_raw, with the run's index records (INDEX_RECORD_SIZE each) first."""
        plan = self.plan_raw_run(start_index, max_bytes, max_count)
        if plan is None:
            return b"", b"", 0
        data = plan.segment.read(plan.offset, plan.length)
        if HEADER.unpack_from(data, 0)[2] != start_index:
            raise CorruptLogError(f"entry {start_index}: data at pos {plan.offset + plan.segment.start} "
                                  f"holds another entry")
        return plan.records, data, plan.count

    def plan_raw_run(self, start_index: int, max_bytes: int, max_count: int) -> RawRunPlan | None:
        """Where read_raw_run's run lies, without reading its data: for a
        reader that sends the bytes straight from the file (sendfile). None
        past the end. The data is only located here, not checked: the reader
        checks every entry's header and CRCs, as it does a read run's."""
        if start_index > self.ledger_end_index or max_count <= 0:
            return None
        self._check_range(start_index)
        # No more entries than max_bytes can hold (each has a header): a
        # caller with no count of its own (the scrubber) must not read the
        # index records of the whole rest of the segment.
        count_wanted = min(max_count, self.ledger_end_index - start_index + 1, max(1, max_bytes // HEADER_SIZE + 1))
        record_offset = start_index * INDEX_RECORD_SIZE
        index_segment = self._index.find(record_offset)
        if index_segment is None:
            raise CorruptLogError(f"entry {start_index}: its index segment is missing")
        # One pread of the records, staying inside their index segment.
        count_wanted = min(count_wanted, (index_segment.end - record_offset) // INDEX_RECORD_SIZE)
        records = index_segment.read(record_offset - index_segment.start, count_wanted * INDEX_RECORD_SIZE)
        first = INDEX_RECORD.unpack_from(records, 0)
        self._check_record(start_index, first)
        first_pos, first_size = first[1], first[2]
        segment = self._data.find(first_pos)
        if segment is None or first_pos + first_size > segment.end:
            raise CorruptLogError(f"entry {start_index}: pos {first_pos} size {first_size} is outside the data")
        total, count = self._run_length(records, start_index, first_pos, first_size,
                                        min(segment.end, first_pos + max(max_bytes, first_size)))
        return RawRunPlan(records[:count * INDEX_RECORD_SIZE], segment, first_pos - segment.start, total, count)

    @staticmethod
    def _run_length(records: bytes, start_index: int, first_pos: int, first_size: int,
                    limit: int) -> tuple[int, int]:
        """How many entries, and bytes, lie back to back from first_pos before `limit`.
        A pos that does not follow on means the next entry is in the next segment."""
        total = first_size
        count = 1
        expected = start_index + 1
        for _, pos, size, index, _ in INDEX_RECORD.iter_unpack(memoryview(records)[INDEX_RECORD_SIZE:]):
            if index != expected or pos != first_pos + total or pos + size > limit:
                break
            total += size
            count += 1
            expected += 1
        return total, count

    def read_entries(self, start_index: int, end_index: int, max_bytes: int) -> list[DLedgerEntry]:
        """Decoded, CRC-checked entries [start_index, end_index] (clipped to the
        log end), at most max_bytes of them but at least one. Past the end: []."""
        if start_index > min(end_index, self.ledger_end_index):
            return []
        self._check_range(start_index)
        last = min(end_index, self.ledger_end_index)
        entries: list[DLedgerEntry] = []
        used = 0
        index = start_index
        while index <= last and (not entries or used < max_bytes):
            data, count = self.read_raw(index, max_bytes - used, last - index + 1)
            for entry in _decode_run(data, index, count):
                if entries and used + entry.size > max_bytes:
                    return entries
                entries.append(entry)
                used += entry.size
            index += count
        return entries

    def indexes_with_magic(self, start_index: int, end_index: int, magic: int) -> list[int]:
        """Indexes in [start_index, end_index] whose entry has `magic`, from the
        32-byte index records alone (no entry data is read)."""
        start = max(start_index, self.ledger_begin_index)
        end = min(end_index, self.ledger_end_index)
        wanted = _MAGIC.pack(magic)
        found: list[int] = []
        chunk = SCAN_CHUNK_BYTES // INDEX_RECORD_SIZE
        while start <= end:
            count = min(chunk, end - start + 1)
            records = self._index.read_across(start * INDEX_RECORD_SIZE, count * INDEX_RECORD_SIZE)
            for offset in range(0, len(records), INDEX_RECORD_SIZE):
                if records[offset:offset + 4] == wanted:  # compare bytes; unpack only the hits
                    record = INDEX_RECORD.unpack_from(records, offset)
                    self._check_record(start + offset // INDEX_RECORD_SIZE, record)
                    found.append(record[3])
            start += count
        return found

    def first_index_of_term(self, term: int, upto_index: int) -> int:
        """Smallest stored index <= upto_index with this term, or -1 when none."""
        high = min(upto_index, self.ledger_end_index)
        low = self.ledger_begin_index
        if high < low or self.term_at(high) < term:
            return -1
        while low < high:
            middle = (low + high) // 2
            if self.term_at(middle) >= term:
                high = middle
            else:
                low = middle + 1
        return low if self.term_at(low) == term else -1

    def _check_range(self, index: int) -> None:
        if index < self.ledger_begin_index:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                               f"index {index} is below the log begin {self.ledger_begin_index}")
        if index > self.ledger_end_index:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                               f"index {index} is beyond the log end {self.ledger_end_index}")

    def _record(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) of entry `index`, checked for sanity."""
        record: tuple[int, int, int, int, int] = INDEX_RECORD.unpack(
            self._index.read(index * INDEX_RECORD_SIZE, INDEX_RECORD_SIZE))
        self._check_record(index, record)
        return record

    @staticmethod
    def _check_record(index: int, record: tuple[int, ...]) -> None:
        magic, _, size, record_index, _ = record
        if record_index != index or magic not in VALID_MAGICS or size < HEADER_SIZE:
            raise CorruptLogError(f"index record {index} is damaged: {record}")

    def _data_bytes(self, pos: int, size: int) -> bytes:
        segment = self._data.find(pos)
        if segment is None or pos + size > segment.end:
            raise CorruptLogError(f"data [{pos}, {pos + size}) is not inside one segment")
        return segment.read(pos - segment.start, size)

    def _read_verified(self, index: int) -> DLedgerEntry:
        magic, pos, size, _, term = self._record(index)
        entry = entry_from_bytes(self._data_bytes(pos, size))
        if (entry.index, entry.pos, entry.term, entry.magic) != (index, pos, term, magic):
            raise CorruptLogError(f"entry {index}: data header (index {entry.index}, pos {entry.pos}, "
                                  f"term {entry.term}) disagrees with its index record")
        return entry

    # ================================================================= durability

    async def flush(self) -> int:
        """Group commit. Each caller takes a ticket; a flush round covers every
        ticket taken before it started, so callers arriving during a round wait
        for it and are then served together by the next one."""
        self._check_not_failed()
        self._flush_requests += 1
        ticket = self._flush_requests
        async with self._flush_lock:
            self._check_not_failed()
            if self._flush_covered < ticket:
                self._flush_covered = self._flush_requests
                try:
                    await self._flush_round()
                except BaseException:
                    # The callers this round covered must not take its failure
                    # for a flush: the next of them in line runs a new round.
                    self._flush_covered = ticket - 1
                    raise
        return self.flushed_index

    async def _flush_round(self) -> None:
        # Only data segments are synced per round: index records past the
        # checkpoint are rebuilt from the data by recovery, and the checkpoint
        # syncs the index before it points at it. One fdatasync per round, not two.
        end_index, end_position, epoch = self.ledger_end_index, self._data.write_position, self._epoch
        data_state = self._data.take_dirty()
        if data_state.segments or data_state.directory:
            if self._executor is None:
                raise DLedgerError(ResponseCode.DISK_ERROR, "the store is not open")
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, sync_dirty, data_state)
            except FsyncError as error:
                raise self._fsync_failed(error) from error
            except BaseException:
                self._data.restore_dirty(data_state)
                raise
            self.fsync_count += 1
        # Nothing dirty means everything written up to the capture is already
        # on disk (synced by an earlier round or by _sync_everything).
        if epoch == self._epoch and end_index > self.flushed_index:
            self.flushed_index = end_index
            self.flushed_position = end_position

    def _sync_everything(self) -> None:
        """fdatasync every open segment and both directories, here and now (close,
        truncate, reset). Syncing all, not just the dirty set, also covers
        segments a concurrent flush round took and has not synced yet."""
        self._check_not_failed()
        for segments in (self._data, self._index):
            segments.take_dirty()  # superseded by syncing every segment below
            self._sync(DirtyState(list(segments.segments), segments.directory, segments.scope))
        self.flushed_index = self.ledger_end_index
        self.flushed_position = self._data.write_position

    def set_committed_index(self, index: int) -> None:
        if index > self.committed_index:
            self.committed_index = index

    def write_checkpoint(self) -> None:
        """Write the checkpoint here and now (truncate, reset, retention,
        close). Any checkpoint still being written in the flush thread from
        before is now stale and will not replace this one."""
        # The checkpoint's end entry is where recovery starts; its index record
        # must be on disk for that (its data is: it is flushed).
        self._check_not_failed()
        self._sync(self._index.take_dirty())
        try:
            self.checkpoint.write(self._checkpoint_now())
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(error, CHECKPOINT_ROOM) from error
            raise

    async def write_checkpoint_in_background(self) -> None:
        """The periodic checkpoint: state captured here, fsyncs and the rename
        in the flush thread, so that a slow disk never stalls the event loop
        (and with it heartbeats)."""
        if self._executor is None or self.failure:
            return
        index_state = self._index.take_dirty()
        checkpoint, generation = self._checkpoint_now(), self.checkpoint.generation
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._persist_checkpoint, index_state, checkpoint,
                                       generation)
        except FsyncError as error:
            raise self._fsync_failed(error) from error
        except OSError as error:
            self._index.restore_dirty(index_state)
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(error, CHECKPOINT_ROOM) from error
            raise
        except BaseException:
            self._index.restore_dirty(index_state)
            raise

    def _persist_checkpoint(self, index_state: DirtyState, checkpoint: Checkpoint, generation: int) -> bool:
        """Flush thread: sync the index records, write the file; False when a
        checkpoint written meanwhile on the event loop makes this one stale."""
        sync_dirty(index_state)
        return self.checkpoint.persist(checkpoint, generation)

    def _checkpoint_now(self) -> Checkpoint:
        return Checkpoint(
            begin_index=self.ledger_begin_index,
            end_index=self.flushed_index,
            # Never more than what is on disk: recovery treats everything up to
            # committedIndex as data it must not cut.
            committed_index=min(self.committed_index, self.flushed_index),
            flushed_position=self.flushed_position,
            before_begin_term=self.before_begin_term,
            before_begin_chain_crc=self.before_begin_chain_crc)

    def _sync(self, state: DirtyState) -> None:
        try:
            sync_dirty(state)
        except FsyncError as error:
            raise self._fsync_failed(error) from error

    def _check_not_failed(self) -> None:
        if self.failure:
            raise DLedgerError(ResponseCode.DISK_ERROR, self.failure)

    def _fsync_failed(self, error: FsyncError) -> DLedgerError:
        """Fail-stop: pages whose writeback failed may be gone while the next
        fdatasync of the same file reports success (Linux clears the error
        once it has reported it), so retrying could acknowledge data the disk
        never got. Nothing is written, flushed or acknowledged from here on."""
        if not self.failure:
            self.failure = (f"fdatasync failed in {self.base_dir}: {error}; the node must stop "
                            f"(restarted, it recovers from what is really on the disk)")
            log.critical("%s", self.failure)
            if self.on_fatal is not None:
                self.on_fatal(self.failure)
        return DLedgerError(ResponseCode.DISK_ERROR, self.failure)

    # ================================================================= retention / disk

    def delete_expired(self, keep_from_index: int, older_than_wall_s: float) -> int:
        """Delete leading data segments whose entries are all below keep_from_index and
        whose mtime is before older_than_wall_s; returns how many went."""
        count = self._move_begin_past_expired(keep_from_index, older_than_wall_s)
        if count == 0:
            return 0
        # Checkpoint before unlinking: a crash in between leaves old files below
        # the recorded begin, which the next pass deletes.
        self.write_checkpoint()
        self._data.delete_first(count)
        self._delete_index_below(self.ledger_begin_index)
        return count

    async def delete_expired_in_background(self, keep_from_index: int, older_than_wall_s: float) -> int:
        """delete_expired with the slow parts (checkpoint fsyncs, unlinking
        whole segments, closing their files) in the flush thread: the event
        loop only moves the begin and takes the segments out of the lists."""
        if self._executor is None or self.failure:
            return 0
        count = self._move_begin_past_expired(keep_from_index, older_than_wall_s)
        if count == 0:
            return 0
        # A checkpoint with the new begin goes to disk first (this one, or a
        # newer one written meanwhile, which has it too).
        epoch, first_start = self._epoch, self._data.first_start
        await self.write_checkpoint_in_background()
        if epoch != self._epoch or first_start != self._data.first_start:
            return 0   # truncated or reset meanwhile: the next pass decides again
        doomed = self._data.detach_first(count)
        doomed += self._index.detach_first(self._index_segments_below(self.ledger_begin_index))
        directories = [self._data.directory, self._index.directory]
        await asyncio.get_running_loop().run_in_executor(self._executor, delete_segments, doomed, directories)
        return count

    def _move_begin_past_expired(self, keep_from_index: int, older_than_wall_s: float) -> int:
        count, first_kept_index = self._expired_prefix(keep_from_index, older_than_wall_s)
        if count == 0:
            return 0
        if first_kept_index > self.ledger_begin_index:
            # The new before-begin entry is the last deleted one: read it first.
            last_deleted = self._read_verified(first_kept_index - 1)
            self.before_begin_term = last_deleted.term
            self.before_begin_chain_crc = last_deleted.chain_crc
            self.ledger_begin_index = first_kept_index
            if self.flushed_index < first_kept_index - 1:
                self.flushed_index = first_kept_index - 1
                self.flushed_position = self._data.segments[count].start
        return count

    def _expired_prefix(self, keep_from_index: int, older_than_wall_s: float) -> tuple[int, int]:
        """How many leading data segments may go, and the first entry after them."""
        segments = self._data.segments
        count = 0
        first_kept_index = self.ledger_begin_index
        while count + 1 < len(segments):
            following = segments[count + 1]
            if following.start >= self._data.write_position:
                break  # never the segment being written
            header = HEADER.unpack(following.read(0, HEADER_SIZE))
            if header[0] not in VALID_MAGICS or header[4] != following.start:
                break
            next_index = header[2]
            if next_index > keep_from_index or segments[count].mtime() >= older_than_wall_s:
                break
            count += 1
            first_kept_index = next_index
        return count, first_kept_index

    def _delete_index_below(self, begin_index: int) -> None:
        self._index.delete_first(self._index_segments_below(begin_index))

    def _index_segments_below(self, begin_index: int) -> int:
        limit = begin_index * INDEX_RECORD_SIZE
        count = 0
        for segment in self._index.segments:
            if segment.end > limit:
                break
            count += 1
        return count

    def check_disk(self) -> None:
        """Read-only while the disk is fuller than disk_full_ratio, or has less
        free space than the last write that failed with ENOSPC needed (plus a
        segment's worth when one must be created); writable again, by itself,
        once the room is back. Runs at start-up, every checkpoint interval and
        before a segment is created."""
        usage = shutil.disk_usage(self.base_dir)
        ratio = usage.used / usage.total if usage.total else 0.0
        reason = ""
        if ratio > self.config.disk_full_ratio:
            reason = (f"the disk holding {self.base_dir} is {ratio:.1%} full (limit "
                      f"{self.config.disk_full_ratio:.0%}); the log is read-only")
        elif usage.free < self._room_needed:
            reason = (f"the disk holding {self.base_dir} has {usage.free} bytes free, {self._room_needed} "
                      f"needed; the log is read-only")
        self._set_read_only(reason)
        if not reason:
            self._room_needed = 0

    def _check_room_for_segments(self, data_end: int, index_end: int) -> None:
        """Before a write that creates segments: is there room for them?"""
        room = 0
        for segments, end in ((self._data, data_end), (self._index, index_end)):
            if end > 0 and segments.find(end - 1) is None:
                room += segments.segment_size if self.config.preallocate else ZERO_FILL_BYTES
        if room and shutil.disk_usage(self.base_dir).free < room:
            self._room_needed = max(self._room_needed, room)
            self.check_disk()
            self._check_writable()

    def _disk_full(self, error: OSError, needed: int) -> DLedgerError:
        """ENOSPC on any write: read-only (not a crash) until check_disk sees
        room for what failed and a little more."""
        self._room_needed = max(self._room_needed, needed + DISK_FULL_MARGIN)
        self._set_read_only(f"the disk holding {self.base_dir} is full ({error.strerror}); "
                            f"the log is read-only until {self._room_needed} bytes are free")
        return DLedgerError(ResponseCode.DISK_FULL, self.read_only_reason)

    def _set_read_only(self, reason: str) -> None:
        if reason and not self.read_only_reason:
            # Free bytes and failing writes can disagree (inodes, quotas):
            # then the state comes and goes, and one line a minute says so.
            now = time.monotonic()
            if now - self._read_only_logged_at >= 60.0:
                self._read_only_logged_at = now
                log.warning("%s: refusing appends and pushes", reason)
        elif not reason and self.read_only_reason:
            log.debug("the disk holding %s has room again: accepting appends", self.base_dir)
        self.read_only_reason = reason

    # ================================================================= recovery

    def _recover(self, checkpoint: Checkpoint | None) -> None:
        start, known = self._scan_start(checkpoint)
        result = self._scanner.scan(start, known, checkpoint.begin_index if checkpoint else 0)
        self._settle(result, checkpoint, from_log_start=start.next_index is None)

    def _scan_start(self, checkpoint: Checkpoint | None) -> tuple[ScanStart, tuple[int, int, int] | None]:
        """Where the scan begins, and (index, term, chain) of the entry before it when known."""
        if checkpoint is not None:
            if checkpoint.end_index == checkpoint.begin_index - 1:
                self._prepare_empty_log(checkpoint)
                known = (checkpoint.end_index, checkpoint.before_begin_term, checkpoint.before_begin_chain_crc)
                return ScanStart(checkpoint.flushed_position, checkpoint.begin_index,
                                 checkpoint.before_begin_chain_crc, checkpoint.before_begin_term), known
            start = self._checkpoint_entry(checkpoint)
            if start is not None:
                return start
        first = self._data.first_start
        return ScanStart(first if first is not None else 0, None, None, 0), None

    def _prepare_empty_log(self, checkpoint: Checkpoint) -> None:
        """The checkpoint says the log is empty from begin_index at flushed_position
        (a reset, or retention of everything): drop files below that position
        and make sure the BLANK before it is in place (finishes an interrupted reset)."""
        begin_pos = checkpoint.flushed_position
        segment_start = self._data.segment_start_of(begin_pos)
        dropped = 0
        for segment in self._data.segments:
            if segment.start >= segment_start:
                break
            dropped += 1
        self._data.delete_first(dropped)
        if self._data.segments and self._data.segments[0].start != segment_start:
            self._data.delete_all()
        self._delete_index_below(checkpoint.begin_index)
        self._install_begin_blank(begin_pos)

    def _checkpoint_entry(self, checkpoint: Checkpoint) -> tuple[ScanStart, tuple[int, int, int]] | None:
        """Start after the checkpoint's end entry if that entry checks out."""
        index = checkpoint.end_index
        try:
            if index < checkpoint.begin_index:
                raise CorruptLogError(f"end {index} is below begin {checkpoint.begin_index}")
            record = INDEX_RECORD.unpack(self._index.read_across(index * INDEX_RECORD_SIZE, INDEX_RECORD_SIZE))
            self._check_record(index, record)
            magic, pos, size, _, term = record
            header = verify_entry(self._data_bytes(pos, size), 0, None)
            if (header.magic, header.pos, header.size, header.index, header.term) != record:
                raise CorruptLogError(f"data header {header} disagrees with index record {record}")
        except CorruptLogError as e:
            log.warning("checkpoint entry %d does not check out (%s); scanning from the log start",
                        index, e.message)
            return None
        return ScanStart(pos + size, index + 1, header.chain_crc, term), (index, term, header.chain_crc)

    def _settle(self, result: ScanResult, checkpoint: Checkpoint | None, from_log_start: bool) -> None:
        """Apply recovery's verdict on where the scan stopped: cut there, set the state."""
        verdict = judge(result, checkpoint, from_log_start)
        if checkpoint is not None:
            self.before_begin_term = checkpoint.before_begin_term
            self.before_begin_chain_crc = checkpoint.before_begin_chain_crc
        if verdict.damage is not None:
            self._found_damage(verdict.damaged_index, checkpoint, result.last_term, verdict.damage)
        elif verdict.torn_tail:
            log.warning("cutting a torn tail at entry %d, pos %d: %s", verdict.end_index + 1, result.end_offset,
                        verdict.torn_tail)
        begin, end_index = verdict.begin_index, verdict.end_index
        committed = checkpoint.committed_index if checkpoint else -1
        self._data.truncate(result.end_offset)
        self._index.truncate((end_index + 1) * INDEX_RECORD_SIZE)
        self._delete_index_below(begin)
        self.ledger_begin_index = begin
        if end_index < begin:
            self._advance(end_index, self.before_begin_term, self.before_begin_chain_crc)
        else:
            self._advance(end_index, result.last_term, result.last_chain_crc)
        self.flushed_index = end_index
        self.flushed_position = self._data.write_position
        self.committed_index = min(committed, end_index)
        self.checkpoint.end_index = checkpoint.end_index if checkpoint else -1
        if self.damaged_from >= 0:
            # The cut goes to disk at once, with a checkpoint that no longer
            # claims what was cut.
            self._sync_everything()
            self.write_checkpoint()
        log.info("opened %s: entries [%d, %d], committed %d, end term %d", self.base_dir, begin, end_index,
                 self.committed_index, self.ledger_end_term)

    def _found_damage(self, index: int, checkpoint: Checkpoint | None, last_valid_term: int,
                      error: CorruptLogError) -> None:
        """Damage at or below what this node flushed, so perhaps acknowledged:
        refuse to open, or (repair_damaged_log) cut the log before it and note
        how far the node must get again before it may vote."""
        if not self.config.repair_damaged_log:
            raise CorruptLogError(f"{error.message}; refusing to cut it")
        self.damaged_from = index
        record_index, record_term = self._scanner.last_index_record()
        self.acknowledged_end = max(index - 1, checkpoint.end_index if checkpoint else -1, record_index)
        # Terms never fall along a log, so the last index record's term (or the
        # last valid entry's, if the records were lost) is the term of the
        # last entry this node ever appended.
        self.acknowledged_end_term = max(last_valid_term, record_term)
        log.error("%s: %s; cutting the log before entry %d and repairing it from the leader up to entry %d",
                  self.base_dir, error.message, index, self.acknowledged_end)

    # ================================================================= damage found while running

    def find_damage(self, start_index: int, max_bytes: int) -> tuple[int, int]:
        """Verify the entries from start_index (at most about max_bytes, CRCs
        and chain links): (the next index to look at, the first damaged
        index or -1)."""
        data, count = self.read_raw(start_index, max_bytes, 1 << 30)
        if count == 0:
            return start_index, -1
        chain = self.chain_crc_at(start_index - 1)
        good, chain = verified_prefix(data, start_index, count, chain)
        if good == count:
            return start_index + count, -1
        index = start_index + good
        at = 0
        for _ in range(good):   # where the failing entry starts: past the good ones
            at += HEADER.unpack_from(data, at)[1]
        try:
            header = verify_entry(data, at, chain)
            raise CorruptLogError(f"entry {index}: data holds entry {header.index}")
        except CorruptLogError as error:
            log.error("%s: %s", self.base_dir, error.message)
        return index, index

    def cut_damaged(self, first_bad: int) -> None:
        """Drop the damaged entry and everything after it, committed or not:
        the node is repairing and fetches them again from the leader."""
        if first_bad > self.ledger_end_index:
            return
        self.committed_index = min(self.committed_index, first_bad - 1)
        self.truncate(first_bad - 1)   # rewrites a checkpoint that points past the cut


def _decode_run(data: bytes, first_index: int, count: int) -> list[DLedgerEntry]:
    """Decode and CRC-check `count` back-to-back entries, chain links included."""
    entries: list[DLedgerEntry] = []
    view = memoryview(data)
    at = 0
    chain: int | None = None
    for i in range(count):
        header = verify_entry(data, at, chain)
        if header.index != first_index + i:
            raise CorruptLogError(f"entry {first_index + i}: data holds entry {header.index}")
        body = bytes(view[at + HEADER_SIZE:at + header.size])
        entries.append(DLedgerEntry(header.index, header.term, header.pos, header.magic, body,
                                    header.body_crc, header.chain_crc, header.channel))
        chain = header.chain_crc
        at += header.size
    return entries


def _disk_error(error: OSError) -> DLedgerError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DLedgerError(ResponseCode.DISK_FULL, f"no space left on the device: {error}")
    return DLedgerError(ResponseCode.DISK_ERROR, f"write failed: {error}")
