"""One fixed-size store file (RocketMQ's MappedFile, with pread/pwrite instead of mmap).

It is the replicated log's segment file (dledger/store/segment.py), created
sparse: unwritten space reads as zeros, which is how ConsumeQueue and
IndexFile recovery find where data ends. Writes go to the page cache; `sync`
(fdatasync) makes them durable and may run in a worker thread while the event
loop keeps writing. Problems with a file are the store's CorruptFileError.
"""
from __future__ import annotations

from dledger.errors import CorruptLogError
from dledger.store.properties import fsync_dir
from dledger.store.segment import Segment
from store.errors import CorruptFileError

__all__ = ["MappedFile", "fsync_dir"]


class MappedFile(Segment):
    """A file of exactly `size` bytes whose first byte is at absolute `start`
    (the start is what a 20-digit file name encodes; IndexFiles use 0)."""

    @classmethod
    def create(cls, path: str, start: int, size: int) -> "MappedFile":  # type: ignore[override]
        return cls.create_at(path, start, size, preallocate=False)  # type: ignore[return-value]

    @classmethod
    def open_existing(cls, path: str, start: int, size: int) -> "MappedFile":
        try:
            return super().open_existing(path, start, size)  # type: ignore[return-value]
        except CorruptLogError as error:
            raise CorruptFileError(f"{error.message} (was the file size setting changed?)") from None

    def read(self, relative: int, length: int) -> bytes:
        try:
            return super().read(relative, length)
        except CorruptLogError as error:
            raise CorruptFileError(error.message) from None

    def __repr__(self) -> str:
        return f"MappedFile({self.path}, start={self.start}, size={self.size})"
