"""RocketMQ's ConsumeQueue: the per (topic, queue id) index into the commit log.

Unit `n` (the message at queue offset n) is 20 bytes at byte offset n * 20:

    commit log offset int64 | message size int32 | tag hash code int64   (big-endian)

in fixed-size files of `units_per_file` units under
`<store dir>/consumequeue/<topic>/<queue id>/`, each named by the 20-digit byte
offset of its first unit. Pulling by queue offset is therefore one pread.

Queue offsets are dense and commit log offsets strictly increase with them, so
a zero unit marks the end (our commit log offsets are always > 0) and the unit
of a given commit log offset is found by binary search.

Writes go to the page cache; `flush` fdatasyncs them. The queue is written by
one owner (the apply loop); `flush` may run in a worker thread meanwhile.
"""
from __future__ import annotations

import enum
import os
import re
import struct
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Final

from store.errors import ConsumeQueueError
from store.mapped_file import MappedFile
from store.mapped_file_queue import MappedFileQueue

CQ_STORE_UNIT_SIZE: Final = 20
DEFAULT_UNITS_PER_FILE: Final = 300_000
# How many units a filtered read may look at to fill one answer (RocketMQ's
# maxFilterMessageSize, 16000 bytes, in units): bounds the cost of a pull on a
# queue full of other tags.
DEFAULT_MAX_FILTER_UNITS: Final = 800
# How many of the last files recovery checks (RocketMQ starts from the third
# last): a torn, unflushed tail can only be in the files written last.
RECOVER_FILES: Final = 3

_UNIT = struct.Struct(">qiq")
_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
# RocketMQ's fillPreBlank unit: fills a queue's first file below its first
# real unit when the queue starts above offset 0. Never a message (commit log
# offsets are > 0), and never the zero unit that marks the end.
BLANK_UNIT = _UNIT.pack(0, _INT32_MAX, 0)
_HIGH_BIT = re.compile(rb"[\x80-\xff]")


# Not frozen: a frozen dataclass costs several times more to build, and a read
# builds one per unit.
@dataclass(slots=True)
class CqUnit:
    """One ConsumeQueue unit and the queue offset it sits at."""

    queue_offset: int
    phys_offset: int
    size: int
    tag_hash: int


class GetStatus(enum.Enum):
    """Outcome of a read, named after RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"      # units were scanned, none had a wanted tag
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"    # the queue is empty and starts at offset 0
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"          # moved: retention deleted it, next_offset is the minimum
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"    # at the end: nothing new yet
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # past the end, next_offset is the end


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    units: list[CqUnit]
    # Where the next read should start: past the units scanned (matched or not)
    # when reading, else the corrected offset (the minimum, or the end).
    next_offset: int
    min_offset: int
    max_offset: int


class ConsumeQueue:
    """The units of one (topic, queue id). Open with `ConsumeQueue.open`."""

    def __init__(self, store_dir: str, topic: str, queue_id: int,
                 units_per_file: int = DEFAULT_UNITS_PER_FILE) -> None:
        if units_per_file <= 0:
            raise ValueError(f"units_per_file must be positive, got {units_per_file}")
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.directory = os.path.join(store_dir, "consumequeue", topic, str(queue_id))
        self._files = MappedFileQueue(self.directory, units_per_file * CQ_STORE_UNIT_SIZE)
        self._min = 0
        self._max = 0
        # Commit log offset of the last unit: units must keep increasing it.
        self._last_phys = 0

    @classmethod
    def open(cls, store_dir: str, topic: str, queue_id: int,
             units_per_file: int = DEFAULT_UNITS_PER_FILE,
             min_phys_offset: int | None = None) -> "ConsumeQueue":
        """Load the files and find the end (a torn last unit is cut). With
        `min_phys_offset` (the commit log's minimum), the minimum queue offset
        is corrected as `delete_before_phys` does; without it, it is the first
        unit of the first file."""
        queue = cls(store_dir, topic, queue_id, units_per_file)
        queue._files.load()
        queue._recover()
        if min_phys_offset is not None:
            queue.delete_before_phys(min_phys_offset)
        return queue

    # --- state -------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The smallest queue offset still readable."""
        return self._min

    @property
    def max_offset(self) -> int:
        """The queue offset the next unit goes to (one past the last unit)."""
        return self._max

    def unit_at(self, queue_offset: int) -> CqUnit | None:
        """The unit at `queue_offset`, or None outside [min_offset, max_offset)."""
        if not self._min <= queue_offset < self._max:
            return None
        return self._read_unit(queue_offset)

    def last_unit(self) -> CqUnit | None:
        return self.unit_at(self._max - 1)

    def _read_unit(self, queue_offset: int) -> CqUnit:
        data = self._files.read(queue_offset * CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE)
        return CqUnit(queue_offset, *_UNIT.unpack(data))

    # --- writes ------------------------------------------------------------------

    def put(self, queue_offset: int, phys_offset: int, size: int, tag_hash: int) -> bool:
        """Store the unit of the message at `queue_offset`.

        At max_offset it is appended (True). Below max_offset the same unit is
        already there (a replay after a crash) and nothing happens (False). A
        different unit there, an offset below min_offset or above max_offset (a
        gap), or a commit log offset not above the previous unit's raise
        ConsumeQueueError, and nothing is written.
        """
        return self.put_batch(queue_offset, ((phys_offset, size, tag_hash),)) == 1

    def put_batch(self, first_queue_offset: int, units: Sequence[tuple[int, int, int]]) -> int:
        """`put` for consecutive units (phys_offset, size, tag_hash) starting at
        `first_queue_offset`, all checked before anything is written, appended
        with one pwrite per file touched. Returns how many were appended (the
        rest were replays of stored units)."""
        if not units:
            return 0
        _check_units(units)
        if first_queue_offset > self._max:
            raise ConsumeQueueError(
                f"{self._name()}: put at queue offset {first_queue_offset} would leave a gap: "
                f"the queue ends at {self._max}")
        if first_queue_offset < self._min:
            raise ConsumeQueueError(
                f"{self._name()}: put at queue offset {first_queue_offset} is below the minimum "
                f"{self._min} (deleted units cannot be compared)")
        replayed = min(len(units), self._max - first_queue_offset)
        if replayed:
            self._check_replay(first_queue_offset, units[:replayed])
        appended = units[replayed:]
        if not appended:
            return 0
        previous = self._last_phys
        for phys_offset, _, _ in appended:
            if phys_offset <= previous:
                raise ConsumeQueueError(
                    f"{self._name()}: commit log offset {phys_offset} is not above the previous unit's "
                    f"{previous}; units must follow the commit log")
            previous = phys_offset
        self._files.write(self._max * CQ_STORE_UNIT_SIZE, b"".join([_UNIT.pack(*unit) for unit in appended]))
        self._max += len(appended)
        self._last_phys = previous
        return len(appended)

    def _check_replay(self, first_queue_offset: int, units: Sequence[tuple[int, int, int]]) -> None:
        stored = self._files.read(first_queue_offset * CQ_STORE_UNIT_SIZE, len(units) * CQ_STORE_UNIT_SIZE)
        expected = b"".join([_UNIT.pack(*unit) for unit in units])
        if stored == expected:
            return
        for index, (old, new) in enumerate(zip(_UNIT.iter_unpack(stored), units)):
            if old != tuple(new):
                raise ConsumeQueueError(
                    f"{self._name()}: queue offset {first_queue_offset + index} already holds unit "
                    f"(phys {old[0]}, size {old[1]}, tag hash {old[2]}), not (phys {new[0]}, size {new[1]}, "
                    f"tag hash {new[2]})")

    def restart_at(self, queue_offset: int) -> None:
        """Drop every file and make the queue begin, empty, at `queue_offset`.
        For a replica whose log no longer holds this queue's earlier messages
        (retention, or a log reset to the leader's first entry): the next put
        is then `queue_offset`, and min_offset stays there across restarts."""
        if queue_offset < 0:
            raise ConsumeQueueError(f"{self._name()}: cannot start at negative offset {queue_offset}")
        self._files.delete_all()
        file_start = queue_offset - queue_offset % self.units_per_file
        if queue_offset > file_start:
            self._files.write(file_start * CQ_STORE_UNIT_SIZE, BLANK_UNIT * (queue_offset - file_start))
        self._min = self._max = queue_offset
        self._last_phys = 0

    def truncate_from_phys(self, phys_offset: int) -> int:
        """Drop every unit whose commit log offset is >= `phys_offset`, so the
        queue never points past the committed log. Returns how many were dropped."""
        cut = self._lower_bound(phys_offset, self._min)
        dropped = self._max - cut
        if dropped <= 0:
            return 0
        start = cut * CQ_STORE_UNIT_SIZE
        self._files.delete_files_after(start)
        self._files.zero(start, self._max * CQ_STORE_UNIT_SIZE)
        self._max = cut
        self._last_phys = self._phys_before(cut)
        return dropped

    def delete_before_phys(self, min_phys_offset: int) -> int:
        """Retention: delete the files whose units all point below
        `min_phys_offset` (never the last file, which takes the writes) and move
        min_offset to the first unit at or above it. Returns files deleted."""
        files = self._files.files
        expired = 0
        for mapped in files[:-1]:
            if self._last_phys_of(mapped) >= min_phys_offset:
                break
            expired += 1
        self._files.delete_first(expired)
        first = self._files.first_start
        floor = max(self._min, first // CQ_STORE_UNIT_SIZE) if first is not None else self._min
        self._min = self._lower_bound(min_phys_offset, floor)
        return expired

    def _last_phys_of(self, mapped: MappedFile) -> int:
        phys_offset: int = _UNIT.unpack(mapped.read(mapped.size - CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE))[0]
        return phys_offset

    def _lower_bound(self, phys_offset: int, low: int) -> int:
        """The first queue offset in [low, max_offset) whose unit's commit log
        offset is >= `phys_offset` (max_offset if none): a binary search, one
        pread per probe, never a scan."""
        high = self._max
        while low < high:
            middle = (low + high) // 2
            if self._read_unit(middle).phys_offset < phys_offset:
                low = middle + 1
            else:
                high = middle
        return low

    # --- reads -------------------------------------------------------------------

    def get(self, queue_offset: int, max_count: int, tag_hashes: Set[int] | None = None,
            max_scan: int = DEFAULT_MAX_FILTER_UNITS) -> GetResult:
        """Up to `max_count` units from `queue_offset` on; with `tag_hashes`,
        only units whose tag hash is in the set, looking at no more than
        max(max_count, max_scan) units. One pread per file touched."""
        if max_count <= 0:
            raise ValueError(f"max_count must be positive, got {max_count}")
        status = self._out_of_range(queue_offset)
        if status is not None:
            next_offset = self._min if status is GetStatus.OFFSET_TOO_SMALL else self._max
            return GetResult(status, [], next_offset, self._min, self._max)
        limit = max_count if tag_hashes is None else max(max_count, max_scan)
        count = min(limit, self._max - queue_offset)
        data = self._files.read(queue_offset * CQ_STORE_UNIT_SIZE, count * CQ_STORE_UNIT_SIZE)
        units: list[CqUnit] = []
        offset = queue_offset
        for phys_offset, size, tag_hash in _UNIT.iter_unpack(data):
            offset += 1
            if tag_hashes is None or tag_hash in tag_hashes:
                units.append(CqUnit(offset - 1, phys_offset, size, tag_hash))
                if len(units) == max_count:
                    break
        status = GetStatus.FOUND if units else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, units, offset, self._min, self._max)

    def _out_of_range(self, queue_offset: int) -> GetStatus | None:
        if self._max == 0:
            return GetStatus.NO_MESSAGE_IN_QUEUE
        if queue_offset < self._min:
            return GetStatus.OFFSET_TOO_SMALL
        if queue_offset == self._max:
            return GetStatus.OFFSET_OVERFLOW_ONE
        if queue_offset > self._max:
            return GetStatus.OFFSET_OVERFLOW_BADLY
        return None

    # --- recovery ----------------------------------------------------------------

    def _recover(self) -> None:
        files = self._files.files
        if not files:
            return
        # A queue started above 0 (restart_at) has pre-blank units first.
        blanks = _leading_blanks(files[0].read(0, files[0].size))
        end = files[0].start + blanks * CQ_STORE_UNIT_SIZE
        for mapped in files[max(0, len(files) - RECOVER_FILES):]:
            data = mapped.read(0, mapped.size)
            skip = blanks if mapped is files[0] else 0
            valid = skip + _valid_prefix(data[skip * CQ_STORE_UNIT_SIZE:])
            end = mapped.start + valid * CQ_STORE_UNIT_SIZE
            if valid < self.units_per_file:
                used = len(data.rstrip(b"\0"))
                if used > valid * CQ_STORE_UNIT_SIZE:
                    # A torn unit or units written out of order before a crash:
                    # clear them so they can never be read back as data.
                    self._files.zero(end, mapped.start + used)
                break
        self._files.delete_files_after(end)
        self._min = files[0].start // CQ_STORE_UNIT_SIZE + blanks
        self._max = end // CQ_STORE_UNIT_SIZE
        self._last_phys = self._phys_before(self._max)

    def _phys_before(self, queue_offset: int) -> int:
        """Commit log offset of the unit before `queue_offset` while its file
        still exists (0 when there is none): what the next unit must exceed."""
        first = self._files.first_start
        if first is None or (queue_offset - 1) * CQ_STORE_UNIT_SIZE < first:
            return 0
        return self._read_unit(queue_offset - 1).phys_offset

    # --- durability and lifetime -------------------------------------------------

    def flush(self) -> int:
        """fdatasync the files written since the last flush (thread-safe)."""
        return self._files.flush()

    def close(self) -> None:
        self._files.close()

    def destroy(self) -> None:
        """Delete every file and the queue's directory."""
        self._files.delete_all()
        if os.path.isdir(self.directory):
            os.rmdir(self.directory)
        self._min = self._max = self._last_phys = 0

    def _name(self) -> str:
        return f"ConsumeQueue {self.topic}/{self.queue_id}"

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic}, {self.queue_id}, min={self._min}, max={self._max})"


def _check_units(units: Sequence[tuple[int, int, int]]) -> None:
    for unit in units:
        phys_offset, size, tag_hash = unit
        if not (isinstance(phys_offset, int) and 0 < phys_offset <= _INT64_MAX):
            raise ConsumeQueueError(f"commit log offset {phys_offset!r} must be a positive int64")
        if not (isinstance(size, int) and 0 < size <= _INT32_MAX):
            raise ConsumeQueueError(f"message size {size!r} must be a positive int32")
        if not (isinstance(tag_hash, int) and -_INT64_MAX - 1 <= tag_hash <= _INT64_MAX):
            raise ConsumeQueueError(f"tag hash {tag_hash!r} must be an int64")


def _leading_blanks(data: bytes) -> int:
    count = 0
    size = CQ_STORE_UNIT_SIZE
    while data[count * size:(count + 1) * size] == BLANK_UNIT:
        count += 1
    return count


def _valid_prefix(data: bytes) -> int:
    """How many leading units are valid (commit log offset > 0 and size > 0).

    Done column-wise so C does the per-unit work: data[i::20] is byte i of
    every unit; OR-ing the columns of a field (as big integers) gives, per unit,
    a byte that is zero exactly when the field is zero; a set top bit in a
    field's first column means it is negative.
    """
    count = len(data) // CQ_STORE_UNIT_SIZE
    if count == 0:
        return 0
    data = data[:count * CQ_STORE_UNIT_SIZE]
    firsts = [
        _column_or(data, 0, 8, count).find(0),   # commit log offset == 0
        _column_or(data, 8, 4, count).find(0),   # size == 0
        _first_high_bit(data[0::CQ_STORE_UNIT_SIZE]),
        _first_high_bit(data[8::CQ_STORE_UNIT_SIZE]),
    ]
    return min((index for index in firsts if index >= 0), default=count)


def _column_or(data: bytes, first: int, width: int, count: int) -> bytes:
    combined = 0
    for column in range(first, first + width):
        combined |= int.from_bytes(data[column::CQ_STORE_UNIT_SIZE], "big")
    return combined.to_bytes(count, "big")


def _first_high_bit(column: bytes) -> int:
    match = _HIGH_BIT.search(column)
    return match.start() if match else -1
