"""RocketMQ's IndexFile: an on-disk hash index from message keys to commit log offsets.

    header   40 bytes   begin timestamp int64, end timestamp int64,
                        begin phys offset int64, end phys offset int64,
                        hash slot count int32 (slots in use), index count int32
    slots    4 bytes each, hash_slot_num of them: the newest item of the slot's chain
    items    20 bytes each, index_num of them:
                        key hash int32, phys offset int64,
                        time diff int32 (seconds after the begin timestamp),
                        previous item of the same slot int32

Items and slots are written before the header, which is written once per
run of puts: after a crash in between, items past the header's count may be
in the file, and slots may point at them. `load` points every such slot
back at the newest item of its chain below the count (the items past it are
replayed from the log), so no chain is cut. Items are never zero-length:
a written item has a non-zero commit log offset.

All big-endian. Item 0 is never used, so 0 in a slot or a "previous" field
means "none" and the index count starts at 1. The key hash is |String.hashCode|
of "topic#key" and the slot is hash % hash_slot_num; colliding keys share a
chain and are told apart by the stored hash (and, by the caller, by reading the
message). A file is full when the index count reaches index_num.

`IndexService` (store/index_service.py) keeps several such files and rolls to a
new one when the last is full.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Final

from store.errors import CorruptFileError
from store.mapped_file import MappedFile

INDEX_HEADER_SIZE: Final = 40
HASH_SLOT_SIZE: Final = 4
INDEX_ITEM_SIZE: Final = 20
INVALID_INDEX: Final = 0
DEFAULT_HASH_SLOT_NUM: Final = 5_000_000
DEFAULT_INDEX_NUM: Final = 20_000_000
_INT32_MAX = (1 << 31) - 1

_HEADER = struct.Struct(">qqqqii")
_ITEM = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ITEM_SIZE


@dataclass(slots=True)
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phys_offset: int = 0
    end_phys_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack(self) -> bytes:
        return _HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phys_offset,
                            self.end_phys_offset, self.hash_slot_count, self.index_count)


class IndexFile:
    """One index file. Create with `IndexFile.create`, reopen with `IndexFile.load`."""

    def __init__(self, mapped: MappedFile, hash_slot_num: int, index_num: int, header: IndexHeader) -> None:
        self._mapped = mapped
        # Memory-mapped, as RocketMQ does: a put is a slot read and three small
        # writes, which as preads/pwrites were four syscalls per key on every
        # replica for every message.
        self._memory = mapped.map()
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.header = header
        self._items_start = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE

    @property
    def path(self) -> str:
        return self._mapped.path

    @property
    def name(self) -> str:
        return os.path.basename(self._mapped.path)

    @classmethod
    def create(cls, path: str, hash_slot_num: int, index_num: int,
               end_phys_offset: int = 0, end_timestamp: int = 0) -> "IndexFile":
        """A new empty file that continues after a full one: its begin and end
        start at the previous file's end, so the replay check and time ranges
        stay continuous across files."""
        _check_geometry(hash_slot_num, index_num)
        mapped = MappedFile.create(path, 0, index_file_size(hash_slot_num, index_num))
        header = IndexHeader(end_timestamp, end_timestamp, end_phys_offset, end_phys_offset)
        index_file = cls(mapped, hash_slot_num, index_num, header)
        index_file._write_header()
        return index_file

    @classmethod
    def load(cls, path: str, hash_slot_num: int, index_num: int) -> "IndexFile":
        _check_geometry(hash_slot_num, index_num)
        mapped = MappedFile.open_existing(path, 0, index_file_size(hash_slot_num, index_num))
        header = IndexHeader(*_HEADER.unpack(mapped.read(0, INDEX_HEADER_SIZE)))
        # A header never written (a crash right after creation) reads as zeros.
        header.index_count = max(header.index_count, 1)
        if header.index_count > index_num or not 0 <= header.hash_slot_count <= hash_slot_num:
            mapped.close()
            raise CorruptFileError(
                f"{path}: header says {header.index_count} items and {header.hash_slot_count} slots in use, "
                f"beyond the file's {index_num} items and {hash_slot_num} slots")
        index_file = cls(mapped, hash_slot_num, index_num, header)
        index_file._repair_slots()
        return index_file

    def _repair_slots(self) -> int:
        """Point slots that name items past the header's count (written by a
        run the crash cut before its header) at the newest item of their
        chain below it. Walks only those items; returns how many slots moved."""
        memory, count = self._memory, self.header.index_count
        repaired = 0
        for item in range(count, self.index_num):
            key_hash, phys_offset, _, _ = _ITEM.unpack_from(memory, self._items_start + item * INDEX_ITEM_SIZE)
            if phys_offset == 0:
                break  # the end of what the cut run wrote
            slot_at = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
            head = _SLOT.unpack_from(memory, slot_at)[0]
            if head >= count:
                _SLOT.pack_into(memory, slot_at, self._newest_below(head, count))
                repaired += 1
        return repaired

    def _newest_below(self, item: int, count: int) -> int:
        """Follow the chain from `item` back to the first item below `count`."""
        while item >= count:
            if item >= self.index_num:
                return INVALID_INDEX
            previous = _ITEM.unpack_from(self._memory, self._items_start + item * INDEX_ITEM_SIZE)[3]
            if not 0 <= previous < item:
                return INVALID_INDEX  # damage: the chain cannot be followed
            item = previous
        return item

    @property
    def is_empty(self) -> bool:
        return self.header.index_count <= 1

    def is_write_full(self) -> bool:
        return self.header.index_count >= self.index_num

    def put_keys(self, items: list[tuple[int, int, int]], start: int = 0) -> int:
        """Add items[start:] (key hash, phys offset, store timestamp), each at
        the head of its slot chain, until the file is full; returns how many
        went in. The header is written once, after the items: an item past
        the header's count is simply not there yet for a reader or a restart."""
        header = self.header
        memory = self._memory
        slots, items_start = self.hash_slot_num, self._items_start
        pack_item, pack_slot, unpack_slot = _ITEM.pack_into, _SLOT.pack_into, _SLOT.unpack_from
        count = header.index_count
        room = self.index_num - count
        batch = items[start:start + room] if start or len(items) > room else items
        for key_hash, phys_offset, store_timestamp in batch:
            slot_at = INDEX_HEADER_SIZE + (key_hash % slots) * HASH_SLOT_SIZE
            previous = unpack_slot(memory, slot_at)[0]
            # Anything outside the written items (a torn write) starts a new chain.
            if not 0 < previous < count:
                previous = INVALID_INDEX
                header.hash_slot_count += 1
            if count <= 1:
                # The first item fixes the file's begin; RocketMQ sets it after
                # computing the first time diff, which skews that item's time.
                header.begin_phys_offset = phys_offset
                header.begin_timestamp = store_timestamp
            time_diff = 0
            if header.begin_timestamp > 0:
                time_diff = min(max((store_timestamp - header.begin_timestamp) // 1000, 0), _INT32_MAX)
            # The item goes in before the slot points at it.
            pack_item(memory, items_start + count * INDEX_ITEM_SIZE, key_hash, phys_offset, time_diff, previous)
            pack_slot(memory, slot_at, count)
            count += 1
            header.end_phys_offset = phys_offset
            header.end_timestamp = store_timestamp
        header.index_count = count
        if batch:
            self._write_header()
        return len(batch)

    def _write_header(self) -> None:
        header = self.header
        _HEADER.pack_into(self._memory, 0, header.begin_timestamp, header.end_timestamp, header.begin_phys_offset,
                          header.end_phys_offset, header.hash_slot_count, header.index_count)

    def _slot_value(self, slot_at: int) -> int:
        value = _SLOT.unpack_from(self._memory, slot_at)[0]
        # Anything outside the written items (a torn write) starts a new chain.
        return value if 0 < value < self.header.index_count else INVALID_INDEX

    def is_time_matched(self, begin: int, end: int) -> bool:
        """Whether [begin, end] (ms) overlaps the file's [begin, end] timestamps."""
        return begin <= self.header.end_timestamp and end >= self.header.begin_timestamp

    def select_phys_offsets(self, found: list[int], key_hash: int, max_num: int, begin: int, end: int,
                            max_phys_offset: int | None = None) -> None:
        """Append to `found` the offsets of the key's items, newest first, whose
        time may lie in [begin, end] and whose offset is below max_phys_offset,
        until `found` holds max_num. Follows the slot chain one pread per item."""
        item = self._slot_value(INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE)
        begin_timestamp = self.header.begin_timestamp
        while item != INVALID_INDEX and len(found) < max_num:
            hash_read, phys_offset, time_diff, previous = _ITEM.unpack_from(
                self._memory, self._items_start + item * INDEX_ITEM_SIZE)
            # Time diffs are whole seconds, rounded down: an item's real time
            # lies in [earliest, earliest + 999].
            earliest = begin_timestamp + time_diff * 1000
            if earliest + 999 < begin:
                break  # older items of the chain are older still
            if (hash_read == key_hash and earliest <= end
                    and (max_phys_offset is None or phys_offset < max_phys_offset)):
                found.append(phys_offset)
            # Chains only point backwards; anything else is damage, and ends the walk.
            item = previous if 0 < previous < item else INVALID_INDEX

    def sync(self) -> bool:
        return self._mapped.sync()

    def close(self) -> None:
        self._memory.close()
        self._mapped.close()

    def delete(self) -> None:
        self._memory.close()
        self._mapped.delete()

    def __repr__(self) -> str:
        return f"IndexFile({self.name}, items={self.header.index_count - 1})"


def _check_geometry(hash_slot_num: int, index_num: int) -> None:
    if hash_slot_num <= 0 or index_num <= 1:
        raise ValueError(f"an index file needs at least one hash slot and two items "
                         f"(item 0 is unused), got {hash_slot_num} slots and {index_num} items")
