"""Topic configuration (RocketMQ's TopicConfig) and its manager (topics.json).

Changed only through system entries (TOPIC_UPDATE, TOPIC_DELETE), so every
replica has the same topics.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from store.config_manager import ConfigManager
from store.system_entry import SystemKind

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_READ_WRITE = PERM_READ | PERM_WRITE
# RocketMQ 5 keeps a topic's message type as the attribute "message.type":
# NORMAL, FIFO, DELAY, TRANSACTION (or MIXED, which accepts all).
MESSAGE_TYPE_ATTRIBUTE = "message.type"
DEFAULT_QUEUE_NUMS = 8  # BrokerConfig.defaultTopicQueueNums


@dataclass(frozen=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def message_type(self) -> str:
        return self.attributes.get(MESSAGE_TYPE_ATTRIBUTE, "MIXED")

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's field names (topics.json is read by operators' tools)."""
        return {_camel(k): v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TopicConfig":
        known = {_camel(name): name for name in cls.__dataclass_fields__}
        return cls(**{known[k]: v for k, v in data.items() if k in known})

    def with_changes(self, **changes: Any) -> "TopicConfig":
        return replace(self, **changes)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class TopicConfigManager(ConfigManager):
    file_name = "topics.json"
    kinds = frozenset({SystemKind.TOPIC_UPDATE, SystemKind.TOPIC_DELETE})

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.topics: dict[str, TopicConfig] = {}

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        if kind == SystemKind.TOPIC_UPDATE:
            config = TopicConfig.from_json(payload["topic"])
            self.topics[config.topic_name] = config
        elif kind == SystemKind.TOPIC_DELETE:
            self.topics.pop(payload["topicName"], None)

    def encode(self) -> dict[str, Any]:
        return {"topicConfigTable": {name: config.to_json() for name, config in sorted(self.topics.items())}}

    def decode(self, data: dict[str, Any]) -> None:
        self.topics = {name: TopicConfig.from_json(value) for name, value in data["topicConfigTable"].items()}


def topic_update_payload(config: TopicConfig) -> dict[str, Any]:
    return {"topic": config.to_json()}


def topic_delete_payload(topic: str) -> dict[str, Any]:
    return {"topicName": topic}
