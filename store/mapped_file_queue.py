"""A directory of contiguous fixed-size files addressed by absolute byte offset
(RocketMQ's MappedFileQueue): each file is named by the 20-digit offset of its
first byte, so offset X lives in file (X - first.start) // size.

Reads and writes spanning files take one pread/pwrite per file touched. Files
written since the last `flush` are remembered and fdatasynced by it, together
with the directory when files were created or deleted.
"""
from __future__ import annotations

import os
import threading

from store.errors import CorruptFileError
from store.mapped_file import MappedFile, fsync_dir

NAME_DIGITS = 20


def file_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """The start offset a file name encodes, or None when it is not a store file name."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


class MappedFileQueue:
    def __init__(self, directory: str, file_size: int) -> None:
        if file_size <= 0:
            raise ValueError(f"file size must be positive, got {file_size}")
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self._dirty: set[MappedFile] = set()
        self._dir_dirty = False
        self._dirty_lock = threading.Lock()

    def load(self) -> None:
        """Open the existing files; they must all be `file_size` long, aligned
        and contiguous (a hole would silently lose data in between)."""
        if not os.path.isdir(self.directory):
            return
        starts = sorted(s for s in map(parse_file_name, os.listdir(self.directory)) if s is not None)
        for start in starts:
            path = os.path.join(self.directory, file_name(start))
            if start % self.file_size:
                raise CorruptFileError(f"{path}: start {start} is not a multiple of the file size {self.file_size}")
            if self.files and self.files[-1].end != start:
                raise CorruptFileError(f"{path}: expected the next file to start at {self.files[-1].end}")
            self.files.append(MappedFile.open_existing(path, start, self.file_size))

    @property
    def first_start(self) -> int | None:
        return self.files[0].start if self.files else None

    @property
    def end(self) -> int:
        """The offset just past the last file (0 when there is none)."""
        return self.files[-1].end if self.files else 0

    def file_at(self, offset: int) -> MappedFile | None:
        if not self.files:
            return None
        index = (offset - self.files[0].start) // self.file_size
        return self.files[index] if 0 <= index < len(self.files) else None

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length), which must lie inside existing files."""
        parts = []
        while length > 0:
            mapped = self.file_at(offset)
            if mapped is None:
                raise ValueError(f"read at {offset} outside the files of {self.directory}")
            chunk = min(length, mapped.end - offset)
            parts.append(mapped.read(offset - mapped.start, chunk))
            offset += chunk
            length -= chunk
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write at `offset`, creating the next files as the data reaches them.
        `offset` must be inside the files or at their end (files stay contiguous)."""
        view = memoryview(data)
        while view:
            mapped = self.file_at(offset)
            if mapped is None:
                mapped = self._create_at(offset)
            chunk = min(len(view), mapped.end - offset)
            mapped.write(offset - mapped.start, view[:chunk])
            self._mark_dirty(mapped)
            view = view[chunk:]
            offset += chunk

    def _create_at(self, offset: int) -> MappedFile:
        start = offset - offset % self.file_size
        if self.files and start != self.files[-1].end:
            raise ValueError(f"offset {offset} is not next to the files of {self.directory} "
                             f"(they end at {self.files[-1].end})")
        os.makedirs(self.directory, exist_ok=True)
        mapped = MappedFile.create(os.path.join(self.directory, file_name(start)), start, self.file_size)
        self.files.append(mapped)
        with self._dirty_lock:
            self._dir_dirty = True
        return mapped

    def _mark_dirty(self, mapped: MappedFile) -> None:
        with self._dirty_lock:
            self._dirty.add(mapped)

    def zero(self, offset: int, end: int) -> None:
        """Overwrite [offset, end) with zeros (end clipped to the files)."""
        end = min(end, self.end)
        if offset < end:
            self.write(offset, bytes(end - offset))

    def delete_files_after(self, offset: int) -> None:
        """Delete every file that starts after `offset`."""
        while self.files and self.files[-1].start > offset:
            self._delete(self.files.pop())

    def delete_first(self, count: int) -> None:
        for mapped in self.files[:count]:
            self._delete(mapped)
        del self.files[:count]

    def _delete(self, mapped: MappedFile) -> None:
        mapped.delete()
        with self._dirty_lock:
            self._dirty.discard(mapped)
            self._dir_dirty = True

    def flush(self) -> int:
        """fdatasync the files written since the last flush; returns how many.
        Safe to call from a worker thread while the owner keeps writing."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        synced = sum(1 for mapped in dirty if mapped.sync())
        if dir_dirty and os.path.isdir(self.directory):
            fsync_dir(self.directory)
        return synced

    def close(self) -> None:
        for mapped in self.files:
            mapped.close()

    def delete_all(self) -> None:
        for mapped in self.files:
            mapped.delete()
        self.files.clear()
        with self._dirty_lock:
            self._dirty.clear()
            self._dir_dirty = False
