"""Consumer group configuration (RocketMQ's SubscriptionGroupConfig) and its
manager (subscriptionGroup.json), changed through system entries."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from store.config_manager import ConfigManager
from store.system_entry import SystemKind
from store.topic_config import _camel


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False       # FIFO: one message of a message group in flight
    retry_queue_nums: int = 1
    retry_max_times: int = 16                   # then the dead-letter queue %DLQ%<group>
    consume_timeout_minute: int = 15
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    attributes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SubscriptionGroupConfig":
        known = {_camel(name): name for name in cls.__dataclass_fields__}
        return cls(**{known[k]: v for k, v in data.items() if k in known})


class SubscriptionGroupManager(ConfigManager):
    file_name = "subscriptionGroup.json"
    kinds = frozenset({SystemKind.GROUP_UPDATE, SystemKind.GROUP_DELETE})

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.groups: dict[str, SubscriptionGroupConfig] = {}

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(group)

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        if kind == SystemKind.GROUP_UPDATE:
            config = SubscriptionGroupConfig.from_json(payload["group"])
            self.groups[config.group_name] = config
        elif kind == SystemKind.GROUP_DELETE:
            self.groups.pop(payload["groupName"], None)

    def encode(self) -> dict[str, Any]:
        return {"subscriptionGroupTable": {name: config.to_json() for name, config in sorted(self.groups.items())}}

    def decode(self, data: dict[str, Any]) -> None:
        self.groups = {name: SubscriptionGroupConfig.from_json(value)
                       for name, value in data["subscriptionGroupTable"].items()}


def group_update_payload(config: SubscriptionGroupConfig) -> dict[str, Any]:
    return {"group": config.to_json()}


def group_delete_payload(group: str) -> dict[str, Any]:
    return {"groupName": group}
