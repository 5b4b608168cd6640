"""One fixed-size store file (RocketMQ's MappedFile, with pread/pwrite instead of mmap).

The file is created at its full size (sparse), so unwritten space reads as
zeros: that is how ConsumeQueue and IndexFile recovery find where data ends.
Writes go to the page cache; `sync` (fdatasync) makes them durable and may run
in a worker thread while the event loop keeps writing.
"""
from __future__ import annotations

import os
import threading

from store.errors import CorruptFileError


class MappedFile:
    """A file of exactly `size` bytes whose first byte is at absolute `start`
    (the start is what a 20-digit file name encodes; IndexFiles use 0)."""

    def __init__(self, path: str, start: int, size: int, fd: int) -> None:
        self.path = path
        self.start = start
        self.size = size
        self._fd = fd
        # Held around fdatasync (flush thread) and close (event loop), so a file
        # deleted meanwhile is never synced through a closed, reused fd number.
        self._lock = threading.Lock()
        self.closed = False

    @property
    def end(self) -> int:
        return self.start + self.size

    @classmethod
    def create(cls, path: str, start: int, size: int) -> "MappedFile":
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(path, start, size, fd)

    @classmethod
    def open_existing(cls, path: str, start: int, size: int) -> "MappedFile":
        fd = os.open(path, os.O_RDWR)
        actual = os.fstat(fd).st_size
        if actual != size:
            os.close(fd)
            raise CorruptFileError(
                f"{path} is {actual} bytes, expected exactly {size} (was the file size setting changed?)")
        return cls(path, start, size, fd)

    def write(self, relative: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` at `relative` (pwrite may write less than asked)."""
        if relative < 0 or relative + len(data) > self.size:
            raise ValueError(f"write [{relative}, {relative + len(data)}) outside {self.path}")
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, relative)
            view = view[written:]
            relative += written

    def read(self, relative: int, length: int) -> bytes:
        if relative < 0 or relative + length > self.size:
            raise ValueError(f"read [{relative}, {relative + length}) outside {self.path}")
        data = os.pread(self._fd, length, relative)
        if len(data) != length:
            raise CorruptFileError(f"{self.path}: read {len(data)} of {length} bytes at {relative}")
        return data

    def sync(self) -> bool:
        """fdatasync; False when the file was closed meanwhile (nothing to do)."""
        with self._lock:
            if self.closed:
                return False
            os.fdatasync(self._fd)
            return True

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self._fd)

    def delete(self) -> None:
        self.close()
        os.unlink(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path}, start={self.start}, size={self.size})"


def fsync_dir(path: str) -> None:
    """Make the creation or removal of files in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
