"""Users and ACL policies, replicated through the log like topics and groups.

Every change is a system entry (the broker's kinds 160..169) applied in log
order on every node, so every node decides the same way and a new leader
knows them; the state is in the leader's metadata snapshots and in
`acl.json` (mode 0600: it holds secrets) for a fast start.

A policy update upserts entries by resource pattern: applied in log order,
two concurrent `acl create` calls for different resources both stay.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any, Callable

from broker.auth.acl import PolicyEntry, User, UserType
from store.config_manager import ConfigManager


class AuthKind(IntEnum):
    USER_UPDATE = 160
    USER_DELETE = 161
    POLICY_UPDATE = 162
    POLICY_DELETE = 163


class AuthMetadataManager(ConfigManager):
    file_name = "acl.json"
    kinds = frozenset(AuthKind)
    file_mode = 0o600

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.users: dict[str, User] = {}
        self.policies: dict[str, list[PolicyEntry]] = {}
        # Called after every change (caches of verified signatures and of
        # decisions are dropped).
        self.listeners: list[Callable[[], None]] = []

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        if kind == AuthKind.USER_UPDATE:
            user = User(payload["name"], payload["secret"], UserType(payload["type"]))
            self.users[user.name] = user
        elif kind == AuthKind.USER_DELETE:
            self.users.pop(payload["name"], None)
            self.policies.pop(payload["name"], None)
        elif kind == AuthKind.POLICY_UPDATE:
            entries = [PolicyEntry.from_json(e) for e in payload["entries"]]
            replaced = {str(e.resource) for e in entries}
            kept = [e for e in self.policies.get(payload["user"], []) if str(e.resource) not in replaced]
            self.policies[payload["user"]] = kept + entries
        elif kind == AuthKind.POLICY_DELETE:
            resources = set(payload.get("resources", []))
            kept = [e for e in self.policies.get(payload["user"], []) if resources and str(e.resource) not in resources]
            if kept:
                self.policies[payload["user"]] = kept
            else:
                self.policies.pop(payload["user"], None)
        self._changed()

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    def encode(self) -> dict[str, Any]:
        return {"users": {n: {"secret": u.secret, "type": u.type.value} for n, u in sorted(self.users.items())},
                "policies": {n: [e.to_json() for e in entries] for n, entries in sorted(self.policies.items())}}

    def decode(self, data: dict[str, Any]) -> None:
        self.users = {n: User(n, u["secret"], UserType(u["type"])) for n, u in data.get("users", {}).items()}
        self.policies = {n: [PolicyEntry.from_json(e) for e in entries]
                         for n, entries in data.get("policies", {}).items()}
        self._changed()


def user_update_payload(user: User) -> dict[str, Any]:
    return {"name": user.name, "secret": user.secret, "type": user.type.value}


def policy_update_payload(user: str, entries: list[PolicyEntry]) -> dict[str, Any]:
    return {"user": user, "entries": [e.to_json() for e in entries]}
