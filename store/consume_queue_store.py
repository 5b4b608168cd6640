"""All ConsumeQueues of a store: `<store dir>/consumequeue/<topic>/<queue id>/`.

Loads every queue on open, creates queues on first use, and applies the
store-wide operations (flush, recovery truncation, retention) to all of them.
"""
from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator

from store.consume_queue import DEFAULT_UNITS_PER_FILE, ConsumeQueue
from store.errors import ConsumeQueueError
from store.mapped_file import fsync_dir

# RocketMQ's TopicValidator pattern; it also keeps topic names safe as directory names.
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# RocketMQ allows 127 characters for user topics and more for retry/DLQ topics.
MAX_TOPIC_LENGTH = 255
MAX_QUEUE_ID = (1 << 31) - 1


def check_topic(topic: str) -> None:
    """ConsumeQueueError unless `topic` is a name RocketMQ accepts."""
    if not isinstance(topic, str) or not topic or len(topic) > MAX_TOPIC_LENGTH or not TOPIC_PATTERN.match(topic):
        raise ConsumeQueueError(
            f"illegal topic {topic!r}: 1 to {MAX_TOPIC_LENGTH} characters of letters, digits, %, |, _ and -")


class ConsumeQueueStore:
    """Owns every ConsumeQueue under `store_dir`. Open with `ConsumeQueueStore.open`."""

    def __init__(self, store_dir: str, units_per_file: int = DEFAULT_UNITS_PER_FILE) -> None:
        self.store_dir = store_dir
        self.root = os.path.join(store_dir, "consumequeue")
        self.units_per_file = units_per_file
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Guards the dict against the flush thread iterating while the owner adds or removes queues.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, store_dir: str, units_per_file: int = DEFAULT_UNITS_PER_FILE,
             min_phys_offset: int | None = None) -> "ConsumeQueueStore":
        """Load and recover every queue on disk (see ConsumeQueue.open)."""
        store = cls(store_dir, units_per_file)
        if os.path.isdir(store.root):
            for topic in sorted(os.listdir(store.root)):
                topic_dir = os.path.join(store.root, topic)
                if not TOPIC_PATTERN.match(topic) or not os.path.isdir(topic_dir):
                    continue
                for name in sorted(os.listdir(topic_dir)):
                    if name.isdigit() and os.path.isdir(os.path.join(topic_dir, name)):
                        queue = ConsumeQueue.open(store_dir, topic, int(name), units_per_file, min_phys_offset)
                        store._queues[(topic, int(name))] = queue
        return store

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue of (topic, queue_id), created empty (no files yet) if new."""
        queue = self._queues.get((topic, queue_id))
        if queue is not None:
            return queue
        check_topic(topic)
        if not isinstance(queue_id, int) or not 0 <= queue_id <= MAX_QUEUE_ID:
            raise ConsumeQueueError(f"illegal queue id {queue_id!r}: must be 0..{MAX_QUEUE_ID}")
        queue = ConsumeQueue(self.store_dir, topic, queue_id, self.units_per_file)
        with self._lock:
            self._queues[(topic, queue_id)] = queue
        return queue

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def queues(self) -> list[ConsumeQueue]:
        with self._lock:
            return list(self._queues.values())

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(self.queues())

    def __len__(self) -> int:
        return len(self._queues)

    def topics(self) -> set[str]:
        return {topic for topic, _ in self._queues}

    def queues_of(self, topic: str) -> list[ConsumeQueue]:
        return sorted((q for (t, _), q in self._queues.items() if t == topic), key=lambda q: q.queue_id)

    def flush(self) -> int:
        """fdatasync every queue's unsynced files; callable from a worker thread."""
        return sum(queue.flush() for queue in self.queues())

    def truncate_from_phys(self, phys_offset: int) -> int:
        """Recovery: drop every unit at or past `phys_offset` in every queue."""
        return sum(queue.truncate_from_phys(phys_offset) for queue in self.queues())

    def delete_before_phys(self, min_phys_offset: int) -> int:
        """Retention: delete expired files of every queue; returns files deleted."""
        return sum(queue.delete_before_phys(min_phys_offset) for queue in self.queues())

    def delete_topic(self, topic: str) -> int:
        """Delete every queue of `topic` and its directory; returns queues deleted."""
        check_topic(topic)  # before the name becomes part of a path given to rmtree
        queues = self.queues_of(topic)
        with self._lock:
            for queue in queues:
                del self._queues[(topic, queue.queue_id)]
        for queue in queues:
            queue.destroy()
        topic_dir = os.path.join(self.root, topic)
        if os.path.isdir(topic_dir):
            shutil.rmtree(topic_dir)
            fsync_dir(self.root)
        return len(queues)

    def close(self) -> None:
        for queue in self.queues():
            queue.close()
