"""The files of one node's replicated log, opened read only (no DLedgerFileStore).

A reader of a node's data dir must never take the store's write path (no
recovery, no truncation, no checkpoint rewrite): the node may be running. So
this module reads the documented layout itself (dledger/entry.py,
dledger/store/file_store.py):

    <data dir>/dledger-<id>/data/<20-digit start>    fixed-size data segments
    <data dir>/dledger-<id>/index/<20-digit start>   32-byte records, entry i at i*32
    <data dir>/dledger-<id>/checkpoint               committedIndex, beginIndex, ...

What is committed comes from the checkpoint alone: the node writes it every
few seconds and at shutdown, never above what is on disk, so every entry at
or below its committedIndex is complete in the data files and never changes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from dledger.entry import (BLANK, HEADER, HEADER_SIZE, INDEX_RECORD, INDEX_RECORD_SIZE, MAGIC_BLANK,
                           VALID_MAGICS)
from dledger.store.properties import read_properties
from dledger.store.segment import parse_segment_name

NODE_DIR_PREFIX = "dledger-"


class LogFilesError(Exception):
    """The path does not hold a readable log, or the log is damaged."""


@dataclass(frozen=True)
class SegmentFile:
    """One fixed-size file covering absolute offsets [start, start + size)."""
    path: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class Checkpoint:
    committed_index: int
    begin_index: int


@dataclass(frozen=True)
class LogFiles:
    """Segments and checkpoint of one node's log. `index` is empty for a bare
    copy of data segments; `checkpoint` is None when there is no checkpoint."""
    base_dir: str
    data: tuple[SegmentFile, ...]
    index: tuple[SegmentFile, ...]
    checkpoint: Checkpoint | None

    # ------------------------------------------------------------ locating

    @classmethod
    def locate(cls, path: str, node_id: str | None = None) -> "LogFiles":
        """The log under `path`: a node's data dir (holding dledger-<id>/), a
        dledger-<id> dir itself, or a directory of data segments (a copy)."""
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            raise LogFilesError(f"{path}: no such directory")
        if os.path.isdir(os.path.join(path, "data")):
            return cls.open(path)
        nodes = sorted(n for n in os.listdir(path) if n.startswith(NODE_DIR_PREFIX)
                       and os.path.isdir(os.path.join(path, n)))
        if node_id is not None:
            wanted = NODE_DIR_PREFIX + node_id
            if wanted not in nodes:
                raise LogFilesError(f"{path}: no {wanted}/ (found {', '.join(nodes) or 'none'})")
            return cls.open(os.path.join(path, wanted))
        if len(nodes) == 1:
            return cls.open(os.path.join(path, nodes[0]))
        if len(nodes) > 1:
            raise LogFilesError(f"{path} holds the logs of several nodes ({', '.join(nodes)}); "
                                f"choose one with the nodeId option")
        if _segments_in(path):
            return cls.open_segment_copy(path)
        raise LogFilesError(f"{path} holds no DLedger log (no dledger-<id>/, data/ or data segments)")

    @classmethod
    def open(cls, base_dir: str) -> "LogFiles":
        checkpoint_path = os.path.join(base_dir, "checkpoint")
        return cls(base_dir, _segments_in(os.path.join(base_dir, "data")),
                   _segments_in(os.path.join(base_dir, "index")),
                   read_checkpoint(checkpoint_path) if os.path.exists(checkpoint_path) else None)

    @classmethod
    def open_segment_copy(cls, directory: str) -> "LogFiles":
        """Data segments copied out of a node, perhaps with its checkpoint beside them."""
        checkpoint_path = os.path.join(directory, "checkpoint")
        return cls(directory, _segments_in(directory), (),
                   read_checkpoint(checkpoint_path) if os.path.exists(checkpoint_path) else None)

    # ------------------------------------------------------------ reading

    @property
    def committed_index(self) -> int | None:
        return self.checkpoint.committed_index if self.checkpoint else None

    def first_entry_of(self, segment: SegmentFile) -> tuple[int, int] | None:
        """(index, pos) of the first entry in `segment`, or None when it holds
        none. A BLANK may lead the first segment (a log reset to a later begin)."""
        with open(segment.path, "rb") as f:
            at = 0
            while at + HEADER_SIZE <= segment.size:
                header = os.pread(f.fileno(), HEADER_SIZE, at)
                magic, size = BLANK.unpack_from(header)
                if magic == MAGIC_BLANK and at == 0 and size >= BLANK.size:
                    at = size
                    continue
                if magic not in VALID_MAGICS:
                    return None
                fields = HEADER.unpack(header)
                if fields[4] != segment.start + at:
                    raise LogFilesError(f"{segment.path}: entry at offset {at} says pos {fields[4]}")
                return fields[2], segment.start + at
        return None

    def index_record(self, index: int) -> tuple[int, int, int] | None:
        """(pos, size, term) of entry `index` from the index files, or None when
        they do not hold it (no index dir, or a record never written)."""
        offset = index * INDEX_RECORD_SIZE
        segment = _find(self.index, offset)
        if segment is None:
            return None
        with open(segment.path, "rb") as f:
            data = os.pread(f.fileno(), INDEX_RECORD_SIZE, offset - segment.start)
        if len(data) != INDEX_RECORD_SIZE:
            return None
        magic, pos, size, record_index, term = INDEX_RECORD.unpack(data)
        if magic not in VALID_MAGICS or record_index != index or size < HEADER_SIZE:
            return None
        return pos, size, term

    def data_segment_of(self, pos: int) -> SegmentFile | None:
        return _find(self.data, pos)

    def chain_crc_at(self, pos: int) -> int:
        """The chain CRC stored in the header of the entry at data position `pos`."""
        segment = self.data_segment_of(pos)
        if segment is None:
            raise LogFilesError(f"no data segment holds position {pos}")
        with open(segment.path, "rb") as f:
            header = os.pread(f.fileno(), HEADER_SIZE, pos - segment.start)
        chain: int = HEADER.unpack(header)[6]
        return chain


def read_checkpoint(path: str) -> Checkpoint:
    """The committed and begin index a node recorded. The file is replaced
    atomically (rename), so a read sees a whole old or a whole new one."""
    values = read_properties(path)
    try:
        return Checkpoint(committed_index=int(values["committedIndex"]),
                          begin_index=int(values.get("beginIndex", "0")))
    except (KeyError, ValueError) as error:
        raise LogFilesError(f"checkpoint {path} has no readable committedIndex ({error})") from None


def _segments_in(directory: str) -> tuple[SegmentFile, ...]:
    if not os.path.isdir(directory):
        return ()
    found: list[SegmentFile] = []
    for name in os.listdir(directory):
        start = parse_segment_name(name)
        if start is None:
            continue
        path = os.path.join(directory, name)
        found.append(SegmentFile(path, start, os.path.getsize(path)))
    found.sort(key=lambda s: s.start)
    for previous, following in zip(found, found[1:]):
        if previous.end != following.start:
            raise LogFilesError(f"{directory}: segment {following.path} does not follow {previous.path}")
    return tuple(found)


def _find(segments: tuple[SegmentFile, ...], offset: int) -> SegmentFile | None:
    if not segments or offset < segments[0].start:
        return None
    k = (offset - segments[0].start) // segments[0].size
    return segments[k] if k < len(segments) else None
