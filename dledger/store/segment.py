"""One fixed-size segment file (DLedger's DefaultMmapFile, without the mmap).

The file is created at its full size, named by the 20-digit absolute offset of
its first byte, and accessed with pread/pwrite on one fd kept open for the
segment's life. Unwritten space reads as zeros, which is how a scan finds the end.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading

from dledger.errors import CorruptLogError

log = logging.getLogger(__name__)

NAME_DIGITS = 20
TMP_SUFFIX = ".creating"   # a segment being created (see Segment.create_at)


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The start offset a file name encodes, or None when it is not a segment name."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


class Segment:
    """A segment covering absolute offsets [start, start + size)."""

    def __init__(self, path: str, start: int, size: int, fd: int) -> None:
        self.path = path
        self.start = start
        self.size = size
        self._fd = fd
        # Held around fdatasync (in the flush thread) and close (on the event
        # loop) so a segment deleted by truncate is never synced through a
        # closed, possibly reused, fd number.
        self._lock = threading.Lock()
        self.closed = False

    @property
    def end(self) -> int:
        return self.start + self.size

    @classmethod
    def create(cls, directory: str, start: int, size: int, preallocate: bool) -> "Segment":
        """Create the file at full size. With `preallocate` the blocks are
        reserved now (posix_fallocate), so a full disk fails here, at the roll,
        rather than in the middle of an entry."""
        return cls.create_at(os.path.join(directory, segment_name(start)), start, size, preallocate)

    @classmethod
    def create_at(cls, path: str, start: int, size: int, preallocate: bool) -> "Segment":
        """Atomic: the file is sized and its size synced under a temporary
        name, then renamed, so a crash in between leaves either no segment or
        a full-size one, never a short file the next start would refuse. (The
        directory is synced with the next flush, before any entry in the new
        segment is acknowledged.)"""
        tmp = path + TMP_SUFFIX
        if os.path.exists(tmp):
            os.unlink(tmp)  # left by a crash during an earlier creation
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _allocate(fd, size, preallocate)
            os.fdatasync(fd)
            if os.path.exists(path):
                raise FileExistsError(errno.EEXIST, "segment exists", path)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return cls(path, start, size, fd)

    @classmethod
    def open_existing(cls, path: str, start: int, size: int, last: bool = False) -> "Segment":
        """Open a segment, which must be full size; a short `last` one (left
        by a crash inside creation before creation was atomic) is completed
        with zeros, which recovery reads as the end of the log (the checkpoint
        check still refuses a log shorter than what was flushed)."""
        fd = os.open(path, os.O_RDWR)
        actual = os.fstat(fd).st_size
        if actual != size:
            if last and actual < size:
                log.warning("segment %s is %d bytes, expected %d: completing a segment whose "
                            "creation was cut short", path, actual, size)
                os.ftruncate(fd, size)
                os.fdatasync(fd)
            else:
                os.close(fd)
                raise CorruptLogError(f"segment {path} is {actual} bytes, expected exactly {size}; "
                                      f"only the last segment may be short")
        return cls(path, start, size, fd)

    def write(self, relative: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` at `relative` (pwrite may write less than asked)."""
        if relative < 0 or relative + len(data) > self.size:
            raise ValueError(f"write [{relative}, {relative + len(data)}) outside segment {self.path}")
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, relative)
            view = view[written:]
            relative += written

    def read(self, relative: int, length: int) -> bytes:
        if relative < 0 or relative + length > self.size:
            raise ValueError(f"read [{relative}, {relative + length}) outside segment {self.path}")
        data = os.pread(self._fd, length, relative)
        if len(data) != length:
            # A file shorter than its recorded size: somebody cut it under us.
            raise CorruptLogError(f"segment {self.path}: read {len(data)} of {length} bytes at {relative}")
        return data

    def sync(self) -> bool:
        """fdatasync; False when the segment was closed meanwhile (nothing to do)."""
        with self._lock:
            if self.closed:
                return False
            os.fdatasync(self._fd)
            return True

    def map(self) -> mmap.mmap:
        """The whole file memory-mapped for reads and writes (shared: writes
        land in the page cache like pwrite's, and sync() makes them durable)."""
        return mmap.mmap(self._fd, self.size)

    def mtime(self) -> float:
        return os.fstat(self._fd).st_mtime

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self._fd)

    def delete(self) -> None:
        self.close()
        os.unlink(self.path)

    def __repr__(self) -> str:
        return f"Segment({segment_name(self.start)}, size={self.size})"


def _allocate(fd: int, size: int, preallocate: bool) -> None:
    if preallocate:
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as e:
            # Some file systems cannot preallocate; a sparse file still works.
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
    os.ftruncate(fd, size)
