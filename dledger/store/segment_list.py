"""An ordered run of equal-size segments of one kind, data or index (DLedger's MmapFileList).

Offsets are absolute: segment k covers [first.start + k*size, first.start + (k+1)*size),
so finding the segment for an offset is one division. Segment starts are
multiples of the segment size (the first one is always created aligned).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from dledger import failpoints
from dledger.errors import CorruptLogError
from dledger.store.properties import fsync_dir
from dledger.store.segment import TMP_SUFFIX, Segment, parse_segment_name

# After a cut, this many bytes past the new end are zeroed (or up to the file
# end) so that a later scan reading forward stops at the cut instead of walking
# into stale entries.
ZERO_FILL_BYTES = 64 * 1024
_ZEROS = bytes(ZERO_FILL_BYTES)


@dataclass
class DirtyState:
    """What a flush must make durable: segments written since the last flush,
    and whether files were created or deleted (the directory needs an fsync)."""
    segments: list[Segment]
    directory: str | None
    scope: str = ""   # whose files (a node id), for failpoints


class SegmentList:
    def __init__(self, directory: str, segment_size: int, preallocate: bool, scope: str = "") -> None:
        self.directory = directory
        self.scope = scope
        self.segment_size = segment_size
        self.preallocate = preallocate
        self.segments: list[Segment] = []
        self.write_position = 0
        self._dirty: dict[Segment, None] = {}  # insertion-ordered set
        self._directory_dirty = False

    # ---- loading -----------------------------------------------------------------

    def load(self) -> None:
        """Open every segment in the directory; they must be contiguous and full size."""
        os.makedirs(self.directory, exist_ok=True)
        starts: list[tuple[int, str]] = []
        for name in os.listdir(self.directory):
            start = parse_segment_name(name)
            if start is not None:
                starts.append((start, name))
            elif name.endswith(TMP_SUFFIX):
                os.unlink(os.path.join(self.directory, name))  # a creation a crash cut short
        starts.sort()
        for position, (start, name) in enumerate(starts):
            if self.segments and start != self.segments[-1].end:
                raise CorruptLogError(
                    f"{self.directory}: segment {name} does not follow {self.segments[-1]} "
                    f"(expected start {self.segments[-1].end}); segments must be contiguous")
            path = os.path.join(self.directory, name)
            last = position == len(starts) - 1
            self.segments.append(Segment.open_existing(path, start, self.segment_size, last))
        self.write_position = self.segments[-1].end if self.segments else 0

    # ---- lookup ------------------------------------------------------------------

    @property
    def first_start(self) -> int | None:
        return self.segments[0].start if self.segments else None

    def find(self, offset: int) -> Segment | None:
        """The segment holding `offset`, or None."""
        if not self.segments:
            return None
        k = (offset - self.segments[0].start) // self.segment_size
        if 0 <= k < len(self.segments):
            return self.segments[k]
        return None

    def segment_start_of(self, offset: int) -> int:
        return offset - offset % self.segment_size

    # ---- writing -----------------------------------------------------------------

    def ensure(self, start: int, end: int) -> None:
        """Create the segments needed to cover [start, end). On failure the
        segments created by this call are removed again."""
        if end <= start:
            return
        if self.segments and start < self.segments[0].start:
            raise ValueError(f"{self.directory}: offset {start} is before the first segment")
        created: list[Segment] = []
        try:
            next_start = self.segments[-1].end if self.segments else self.segment_start_of(start)
            while next_start < end:
                segment = Segment.create(self.directory, next_start, self.segment_size, self.preallocate)
                created.append(segment)
                self.segments.append(segment)
                next_start = segment.end
        except BaseException:
            for segment in reversed(created):
                self.segments.pop()
                segment.delete()
            raise
        if created:
            self._directory_dirty = True

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write at an absolute offset, splitting at segment ends (one pwrite per
        segment). The segments must exist (see ensure)."""
        view = memoryview(data)
        while view:
            segment = self.find(offset)
            if segment is None:
                raise ValueError(f"{self.directory}: no segment holds offset {offset}")
            n = min(len(view), segment.end - offset)
            segment.write(offset - segment.start, view[:n])
            self._dirty[segment] = None
            view = view[n:]
            offset += n

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the write position and advance it; returns where the data went."""
        start = self.write_position
        self.ensure(start, start + len(data))
        self.write(start, data)
        self.write_position = start + len(data)
        return start

    # ---- reading -----------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """Read [offset, offset+length) inside one segment."""
        segment = self.find(offset)
        if segment is None:
            raise CorruptLogError(f"{self.directory}: no segment holds offset {offset}")
        return segment.read(offset - segment.start, length)

    def read_across(self, offset: int, length: int) -> bytes:
        """Read a range that may span segments; missing segments read as zeros."""
        parts: list[bytes] = []
        while length > 0:
            segment = self.find(offset)
            if segment is None:
                room = self.segment_size - (offset % self.segment_size)
                n = min(length, room)
                parts.append(bytes(n))
            else:
                n = min(length, segment.end - offset)
                parts.append(segment.read(offset - segment.start, n))
            offset += n
            length -= n
        return b"".join(parts)

    # ---- cutting and deleting ------------------------------------------------------

    def truncate(self, offset: int, zero_bytes: int = ZERO_FILL_BYTES) -> None:
        """Make `offset` the end: delete the segments after the one holding it,
        zero the next bytes of that one, and move the write position there."""
        while self.segments and self.segments[-1].start > offset:
            self._delete(self.segments.pop())
        segment = self.find(offset)
        if segment is not None:
            self._zero(segment, offset, min(zero_bytes, segment.end - offset))
        self.write_position = offset

    def _zero(self, segment: Segment, offset: int, length: int) -> None:
        relative = offset - segment.start
        while length > 0:
            n = min(length, ZERO_FILL_BYTES)
            # Reading first keeps a clean restart from dirtying pages for nothing.
            if segment.read(relative, n) != _ZEROS[:n]:
                segment.write(relative, _ZEROS[:n])
                self._dirty[segment] = None
            relative += n
            length -= n

    def delete_first(self, count: int) -> None:
        for _ in range(count):
            self._delete(self.segments.pop(0))

    def detach_first(self, count: int) -> list[Segment]:
        """Take the first `count` segments out of the list, to be deleted
        elsewhere (delete_segments, in the flush thread)."""
        detached = self.segments[:count]
        del self.segments[:count]
        for segment in detached:
            self._dirty.pop(segment, None)
        return detached

    def delete_all(self) -> None:
        while self.segments:
            self._delete(self.segments.pop())

    def _delete(self, segment: Segment) -> None:
        self._dirty.pop(segment, None)
        segment.delete()
        self._directory_dirty = True

    # ---- durability ----------------------------------------------------------------

    def take_dirty(self) -> DirtyState:
        """Hand the pending work to a flush; writes after this start a new set."""
        state = DirtyState(list(self._dirty), self.directory if self._directory_dirty else None, self.scope)
        self._dirty.clear()
        self._directory_dirty = False
        return state

    def restore_dirty(self, state: DirtyState) -> None:
        """Put back work a failed flush did not finish, so the next flush retries it."""
        for segment in state.segments:
            if not segment.closed:
                self._dirty[segment] = None
        if state.directory is not None:
            self._directory_dirty = True

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self._dirty.clear()


class FsyncError(Exception):
    """An fdatasync (or a directory fsync) failed: unlike a failed write,
    not something to retry (see DLedgerFileStore._fsync_failed)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(f"{error.strerror or error}")
        self.error = error


def delete_segments(segments: list[Segment], directories: list[str]) -> None:
    """Flush thread: close and unlink detached segments, then make the
    unlinks durable."""
    for segment in segments:
        segment.delete()
    if segments:
        for directory in directories:
            fsync_dir(directory)


def sync_dirty(state: DirtyState) -> int:
    """fdatasync the segments (and the directory); returns how many syscalls ran.
    Runs in the store's flush thread. Raises FsyncError."""
    count = 0
    try:
        if state.segments:
            failpoints.fire(failpoints.FSYNC, state.scope)
        for segment in state.segments:
            if segment.sync():
                count += 1
        if state.directory is not None:
            fsync_dir(state.directory)
            count += 1
    except OSError as error:
        raise FsyncError(error) from error
    return count
