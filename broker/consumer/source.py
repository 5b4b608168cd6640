"""A queue's messages for the pop decisions, read from the message store, and
where a consumer group that has never consumed a queue starts."""
from __future__ import annotations

from store.codec import MessageExt
from store.consume_queue import GetStatus
from store.message_store import MessageStore


class StoreQueueSource:
    """selection.MessageSource over one (topic, queue id) of the store."""

    def __init__(self, store: MessageStore, topic: str, queue_id: int) -> None:
        self.store = store
        self.topic = topic
        self.queue_id = queue_id

    def read(self, offset: int) -> MessageExt | None:
        found = self.store.get_messages(self.topic, self.queue_id, offset, 1)
        if found.messages and found.messages[0].queue_offset == offset:
            return found.messages[0]
        return None

    def scan(self, start: int, max_count: int, tag_hashes: set[int] | None) -> tuple[list[MessageExt], int]:
        found = self.store.get_messages(self.topic, self.queue_id, start, max_count, tag_hashes)
        if found.status is GetStatus.OFFSET_TOO_SMALL:
            # Retention deleted what the group had not consumed yet: go on
            # from the first message still there, as RocketMQ does.
            found = self.store.get_messages(self.topic, self.queue_id, found.next_offset, max_count, tag_hashes)
        if found.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
            return [], start
        return found.messages, found.next_offset


def initial_offset(store: MessageStore, group: str, topic: str, queue_id: int) -> int:
    """Where `group` starts on a queue of the store it has never popped."""
    return start_offset(store.offsets.query(group, topic, queue_id), store.min_offset(topic, queue_id),
                        store.max_offset(topic, queue_id))


def start_offset(committed: int | None, min_offset: int, max_offset: int) -> int:
    """A group's committed offset if it has one (a pull consumer's, or a
    reset); else the queue's first message while nothing has been deleted from
    it (what RocketMQ does in practice for fresh queues), else its end."""
    if committed is not None:
        return committed
    return 0 if min_offset == 0 else max_offset
