"""RocketMQ's IndexService: message keys to commit log offsets, over several IndexFiles.

Files live in `<store dir>/index/`, named by their creation time as
yyyyMMddHHmmssSSS. Unlike RocketMQ (local time) the name is in UTC and always
later than the previous file's name, so name order is creation order even
across a clock change or two files created within one millisecond. Only the
last file is written; when it is full a new one is created.

Each message is indexed under "topic#key" for its unique key (the client
message id) and for each of its space-separated KEYS. Files are derived data,
like ConsumeQueues: recovery drops files that begin past the committed log and
retention drops files that end before the log's minimum offset.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from store import message_const as mc
from store.errors import CorruptFileError
from store.index_file import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM, IndexFile
from store.java_hash import index_key_hash, index_key_hashes
from store.mapped_file import fsync_dir

NAME_FORMAT = "%Y%m%d%H%M%S"
NAME_LENGTH = 17
_INT64_MAX = (1 << 63) - 1


# What the index needs of one message: (topic, KEYS, UNIQ_KEY, commit log
# offset, store timestamp, sys flag).
IndexedMessage = tuple[str, str | None, str | None, int, int, int]


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def file_name_of(time_ms: int) -> str:
    """yyyyMMddHHmmssSSS (UTC) of a time in ms since the epoch."""
    moment = datetime.fromtimestamp(time_ms // 1000, tz=timezone.utc)
    return f"{moment.strftime(NAME_FORMAT)}{time_ms % 1000:03d}"


def time_of_file_name(name: str) -> int | None:
    """The ms since the epoch a file name encodes, or None when it is not an index file name."""
    if len(name) != NAME_LENGTH or not name.isdigit():
        return None
    try:
        moment = datetime.strptime(name[:-3], NAME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(moment.timestamp()) * 1000 + int(name[-3:])


class IndexService:
    """Owns the IndexFiles of a store. Open with `IndexService.open`.

    Written by one owner (the apply loop); `flush` may run in a worker thread.
    """

    def __init__(self, store_dir: str, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, clock: Callable[[], float] = time.time) -> None:
        self.directory = os.path.join(store_dir, "index")
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self._clock = clock  # wall clock: it only names files
        self._files: list[IndexFile] = []
        self._dirty: set[IndexFile] = set()
        self._dir_dirty = False
        self._lock = threading.Lock()

    @classmethod
    def open(cls, store_dir: str, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
             index_num: int = DEFAULT_INDEX_NUM, committed_end: int | None = None,
             clock: Callable[[], float] = time.time) -> "IndexService":
        """Load the files in name order. With `committed_end` (the end of the
        committed log), a file whose items all lie at or past it, and every
        file after it, is deleted: they index entries this log does not hold."""
        service = cls(store_dir, hash_slot_num, index_num, clock)
        if os.path.isdir(service.directory):
            names = sorted(n for n in os.listdir(service.directory) if time_of_file_name(n) is not None)
            for name in names:
                service._files.append(IndexFile.load(os.path.join(service.directory, name), hash_slot_num, index_num))
        if committed_end is not None:
            service._drop_files_past(committed_end)
        return service

    def _drop_files_past(self, committed_end: int) -> None:
        for position, index_file in enumerate(self._files):
            if not index_file.is_empty and index_file.header.begin_phys_offset >= committed_end:
                self._delete_files(self._files[position:])
                return

    @property
    def files(self) -> list[IndexFile]:
        return list(self._files)

    @property
    def end_phys_offset(self) -> int:
        """Commit log offset of the last indexed message (0 when none)."""
        return self._files[-1].header.end_phys_offset if self._files else 0

    # --- writes ------------------------------------------------------------------

    def put(self, key: str, phys_offset: int, store_timestamp: int) -> None:
        """Index `key` (already "topic#key") for the message at `phys_offset`,
        rolling to a new file when the last one is full."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"index key must be a non-empty str, got {key!r}")
        if not isinstance(phys_offset, int) or not 0 < phys_offset <= _INT64_MAX:
            raise ValueError(f"commit log offset {phys_offset!r} must be a positive int64")
        if not isinstance(store_timestamp, int) or not 0 <= store_timestamp <= _INT64_MAX:
            raise ValueError(f"store timestamp {store_timestamp!r} must be a non-negative int64 (ms)")
        self._put_items([(index_key_hash(key), phys_offset, store_timestamp)])

    def _put_items(self, items: list[tuple[int, int, int]]) -> None:
        """Write (key hash, phys offset, store timestamp) items, rolling to a
        new file whenever the last one fills up."""
        done = 0
        while done < len(items):
            index_file = self._writable_file()
            put = index_file.put_keys(items, done)
            if put == 0:
                raise CorruptFileError(f"{index_file.path}: refused an item although it is not full")
            done += put
            with self._lock:
                self._dirty.add(index_file)

    def put_message(self, topic: str, keys: str | None, uniq_key: str | None, phys_offset: int,
                    store_timestamp: int, sys_flag: int = 0) -> int:
        """Index one dispatched message as RocketMQ's buildIndex does: its
        unique key, then each of its KEYS; nothing for a rolled-back
        transaction, nor for a message at or below the last one indexed (a
        replay after a crash). Returns how many keys were indexed."""
        return self.put_messages([(topic, keys, uniq_key, phys_offset, store_timestamp, sys_flag)])

    def put_messages(self, messages: list[IndexedMessage]) -> int:
        """`put_message` for (topic, keys, uniq_key, phys_offset, store_timestamp,
        sys_flag) of consecutive messages, in log order: the apply loop hands
        over a whole run at once, so the header is written once per file, not
        once per key. Returns how many keys were indexed."""
        end = self.end_phys_offset
        index_keys: list[str] = []
        places: list[tuple[int, int]] = []   # (phys offset, store timestamp) of each key
        for topic, keys, uniq_key, phys_offset, store_timestamp, sys_flag in messages:
            if phys_offset <= end or mc.transaction_type(sys_flag) == mc.TRANSACTION_ROLLBACK_TYPE:
                continue
            if not 0 < phys_offset <= _INT64_MAX or not 0 <= store_timestamp <= _INT64_MAX:
                raise ValueError(f"commit log offset {phys_offset} and store timestamp {store_timestamp} "
                                 "must be a positive and a non-negative int64")
            end = phys_offset
            if uniq_key:
                index_keys.append(build_key(topic, uniq_key))
                places.append((phys_offset, store_timestamp))
            if keys:
                for key in keys.split(mc.KEY_SEPARATOR):
                    if key:
                        index_keys.append(build_key(topic, key))
                        places.append((phys_offset, store_timestamp))
        if index_keys:
            # The run's key hashes at once (index_key_hashes), not one by one.
            self._put_items([(key_hash, phys_offset, store_timestamp) for key_hash, (phys_offset, store_timestamp)
                             in zip(index_key_hashes(index_keys), places)])
        return len(index_keys)

    def _writable_file(self) -> IndexFile:
        if self._files and not self._files[-1].is_write_full():
            return self._files[-1]
        previous = self._files[-1].header if self._files else None
        os.makedirs(self.directory, exist_ok=True)
        index_file = IndexFile.create(
            os.path.join(self.directory, self._next_file_name()), self.hash_slot_num, self.index_num,
            previous.end_phys_offset if previous else 0, previous.end_timestamp if previous else 0)
        with self._lock:
            self._files.append(index_file)
            self._dir_dirty = True
        return index_file

    def _next_file_name(self) -> str:
        now = int(self._clock() * 1000)
        if self._files:
            last = time_of_file_name(self._files[-1].name)
            if last is not None and now <= last:
                now = last + 1
        return file_name_of(now)

    # --- reads -------------------------------------------------------------------

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
              max_phys_offset: int | None = None) -> list[int]:
        """Commit log offsets of messages indexed under topic#key whose store
        time may lie in [begin_ms, end_ms], newest first, at most max_num.
        Items at or past max_phys_offset (pass the committed end) are ignored.
        Colliding keys can slip through: the caller checks the messages' keys."""
        if max_num <= 0:
            raise ValueError(f"max_num must be positive, got {max_num}")
        key_hash = index_key_hash(build_key(topic, key))
        found: list[int] = []
        for index_file in reversed(self.files):
            if not index_file.is_empty and index_file.is_time_matched(begin_ms, end_ms):
                index_file.select_phys_offsets(found, key_hash, max_num, begin_ms, end_ms, max_phys_offset)
            if index_file.header.begin_timestamp < begin_ms or len(found) >= max_num:
                break
        # A message indexed twice (a replay that RocketMQ's check lets through) is one answer.
        return list(dict.fromkeys(found))

    # --- retention, durability ---------------------------------------------------

    def delete_expired(self, min_phys_offset: int) -> int:
        """Delete the oldest files whose last item is below the log's minimum
        offset (never the last file). Returns how many were deleted."""
        expired = 0
        for index_file in self._files[:-1]:
            if index_file.header.end_phys_offset >= min_phys_offset:
                break
            expired += 1
        self._delete_files(self._files[:expired])
        return expired

    def _delete_files(self, doomed: list[IndexFile]) -> None:
        with self._lock:
            for index_file in doomed:
                self._files.remove(index_file)
                self._dirty.discard(index_file)
            self._dir_dirty = self._dir_dirty or bool(doomed)
        for index_file in doomed:
            index_file.delete()

    def flush(self) -> int:
        """fdatasync the files written since the last flush; returns how many."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        synced = sum(1 for index_file in dirty if index_file.sync())
        if dir_dirty and os.path.isdir(self.directory):
            fsync_dir(self.directory)
        return synced

    def close(self) -> None:
        for index_file in self._files:
            index_file.close()
