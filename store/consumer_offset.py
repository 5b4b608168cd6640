"""Committed consumer offsets (RocketMQ's ConsumerOffsetManager, consumerOffset.json).

An offset is the next queue offset a group will consume. Commits travel as
CONSUMER_OFFSETS system entries carrying many (group, topic, queue, offset)
at once, so a busy broker writes one small entry per commit interval rather
than one per acknowledgement. A commit sets the offset (it may go back: a
reset to an earlier time is a commit too).
"""
from __future__ import annotations

from typing import Any, Iterable

from store.config_manager import ConfigManager
from store.system_entry import SystemKind

TOPIC_GROUP_SEPARATOR = "@"
OffsetCommit = tuple[str, str, int, int]  # group, topic, queue id, offset


class ConsumerOffsetManager(ConfigManager):
    file_name = "consumerOffset.json"
    kinds = frozenset({SystemKind.CONSUMER_OFFSETS})
    snapshot_on_change = False     # moves while any group consumes

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        # "topic@group" -> queue id -> offset, as RocketMQ keys it.
        self.offsets: dict[str, dict[int, int]] = {}

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id)

    def groups_of(self, topic: str) -> list[str]:
        suffix_at = len(topic) + 1
        return sorted(key[suffix_at:] for key in self.offsets if key.startswith(topic + TOPIC_GROUP_SEPARATOR))

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        for group, topic, queue_id, offset in payload["offsets"]:
            self.offsets.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})[int(queue_id)] = int(offset)

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self.offsets if k.startswith(topic + TOPIC_GROUP_SEPARATOR)]:
            del self.offsets[key]

    def encode(self) -> dict[str, Any]:
        return {"offsetTable": {key: {str(q): o for q, o in sorted(queues.items())}
                                for key, queues in sorted(self.offsets.items())}}

    def decode(self, data: dict[str, Any]) -> None:
        self.offsets = {key: {int(q): int(o) for q, o in queues.items()}
                        for key, queues in data["offsetTable"].items()}


def offsets_payload(commits: Iterable[OffsetCommit]) -> dict[str, Any]:
    return {"offsets": [[group, topic, queue_id, offset] for group, topic, queue_id, offset in commits]}
