"""ACL 2.0 matching (RocketMQ 5.3's model): plain data and pure functions.

A user is Super (no checks) or Normal. A policy binds a subject
`User:<name>` to entries; each entry names a resource pattern, actions,
optional source IP ranges and a decision (Allow or Deny). For one request
(user, resource, action, source IP) the entries that match are ranked by how
specifically their pattern names the resource:

    literal (`Topic:orders`)                                   most specific
    prefix (`Topic:orders*`), a longer prefix before a shorter
    the resource's namespace (`Namespace:<ns>`)
    any of a type (`Topic:*`)
    anything (`*`)                                             least specific

The most specific rank decides; within it Deny wins a tie; nothing matching
denies. `All` covers every action. Names of a namespace are wrapped as
RocketMQ's proxy does (`<ns>%<name>`), so `Topic:ns1%orders` names one
topic of namespace ns1 and `Namespace:ns1` every topic and group in it.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable


class UserType(str, Enum):
    SUPER = "Super"
    NORMAL = "Normal"


class Action(str, Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class Decision(str, Enum):
    ALLOW = "Allow"
    DENY = "Deny"


class ResourceType(str, Enum):
    CLUSTER = "Cluster"
    NAMESPACE = "Namespace"
    TOPIC = "Topic"
    GROUP = "Group"


class AclError(ValueError):
    """A resource, action or IP range that cannot be parsed."""


NAMESPACE_SEPARATOR = "%"


@dataclass(frozen=True)
class Resource:
    """What a request touches: a topic or group by its full (wrapped) name,
    the cluster, or a namespace."""
    type: ResourceType
    name: str = ""

    @property
    def namespace(self) -> str:
        if self.type in (ResourceType.TOPIC, ResourceType.GROUP) and NAMESPACE_SEPARATOR in self.name:
            return self.name.split(NAMESPACE_SEPARATOR, 1)[0]
        return self.name if self.type == ResourceType.NAMESPACE else ""

    def __str__(self) -> str:
        return self.type.value if self.type == ResourceType.CLUSTER else f"{self.type.value}:{self.name}"


def topic(name: str, namespace: str = "") -> Resource:
    return Resource(ResourceType.TOPIC, wrap(namespace, name))


def group(name: str, namespace: str = "") -> Resource:
    return Resource(ResourceType.GROUP, wrap(namespace, name))


CLUSTER = Resource(ResourceType.CLUSTER)


def wrap(namespace: str, name: str) -> str:
    """RocketMQ's `<ns>%<name>`; a name already wrapped stays as it is."""
    if not namespace or name.startswith(namespace + NAMESPACE_SEPARATOR):
        return name
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


# Ranks of a pattern's specificity (higher wins), before the prefix length.
_ANY, _TYPE_ANY, _NAMESPACE, _PREFIX, _LITERAL = range(5)


@dataclass(frozen=True)
class ResourcePattern:
    """`*`, `Cluster`, `Namespace:<ns>`, `Topic:<name>`, `Topic:<prefix>*`,
    `Topic:*` (and the same for Group)."""
    type: ResourceType | None   # None: `*`
    name: str = ""
    prefix: bool = False

    @classmethod
    def parse(cls, text: str) -> "ResourcePattern":
        text = text.strip()
        if text == "*":
            return cls(None)
        kind, _, name = text.partition(":")
        try:
            resource_type = ResourceType(kind)
        except ValueError:
            raise AclError(f"resource {text!r}: expected *, Cluster, Namespace:<ns>, Topic:<name> or "
                           f"Group:<name> (a name may end in * for a prefix)") from None
        if resource_type == ResourceType.CLUSTER:
            return cls(resource_type)
        if not name:
            raise AclError(f"resource {text!r} names no {kind.lower()}")
        if name.endswith("*"):
            return cls(resource_type, name[:-1], prefix=True)
        return cls(resource_type, name)

    def __str__(self) -> str:
        if self.type is None:
            return "*"
        if self.type == ResourceType.CLUSTER:
            return "Cluster"
        return f"{self.type.value}:{self.name}{'*' if self.prefix else ''}"

    def rank(self, resource: Resource) -> tuple[int, int] | None:
        """How specifically this pattern names `resource`; None: not at all."""
        if self.type is None:
            return (_ANY, 0)
        if self.type == ResourceType.NAMESPACE and resource.type != ResourceType.NAMESPACE:
            if resource.type in (ResourceType.TOPIC, ResourceType.GROUP) and resource.namespace == self.name:
                return (_NAMESPACE, 0)
            return None
        if self.type != resource.type:
            return None
        if self.type == ResourceType.CLUSTER:
            return (_LITERAL, 0)
        if self.prefix:
            if not self.name:
                return (_TYPE_ANY, 0)
            return (_PREFIX, len(self.name)) if resource.name.startswith(self.name) else None
        return (_LITERAL, 0) if resource.name == self.name else None


@dataclass(frozen=True)
class PolicyEntry:
    resource: ResourcePattern
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def covers(self, action: Action, source_ip: str) -> bool:
        if Action.ALL not in self.actions and action not in self.actions:
            return False
        return not self.source_ips or _in_ranges(source_ip, self.source_ips)

    def to_json(self) -> dict[str, object]:
        return {"resource": str(self.resource), "actions": sorted(a.value for a in self.actions),
                "decision": self.decision.value, "sourceIps": [str(n) for n in self.source_ips]}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> "PolicyEntry":
        return make_entry(str(data["resource"]), [str(a) for a in data.get("actions", [])],  # type: ignore[union-attr]
                          str(data.get("decision", "Allow")),
                          [str(ip) for ip in data.get("sourceIps", [])])  # type: ignore[union-attr]


def make_entry(resource: str, actions: Iterable[str], decision: str = "Allow",
               source_ips: Iterable[str] = ()) -> PolicyEntry:
    """An entry from text, every part checked (an AclError names the bad one)."""
    pattern = ResourcePattern.parse(resource)
    parsed: set[Action] = set()
    for text in actions:
        try:
            parsed.add(Action(text.strip().capitalize()))
        except ValueError:
            raise AclError(f"action {text!r}: expected one of {', '.join(a.value for a in Action)}") from None
    if not parsed:
        raise AclError("a policy entry needs at least one action")
    try:
        verdict = Decision(decision.strip().capitalize())
    except ValueError:
        raise AclError(f"decision {decision!r}: expected Allow or Deny") from None
    networks = []
    for text in source_ips:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise AclError(f"source IP range {text!r} is not an address or CIDR range") from None
    return PolicyEntry(pattern, frozenset(parsed), verdict, tuple(networks))


def _in_ranges(source_ip: str, ranges: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(source_ip)
    except ValueError:
        return False
    return any(address.version == net.version and address in net for net in ranges)


@dataclass(frozen=True)
class User:
    name: str
    secret: str = field(repr=False)   # never printed
    type: UserType = UserType.NORMAL


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    entry: PolicyEntry | None = None   # the deciding entry, None: super user or no match

    @property
    def reason(self) -> str:
        if self.entry is None:
            return "super user" if self.allowed else "no policy entry matches"
        return f"{self.entry.decision.value} by {self.entry.resource}"


def decide(user: User, entries: Iterable[PolicyEntry], resource: Resource, action: Action,
           source_ip: str = "") -> Verdict:
    """The ACL 2.0 decision for one (user, resource, action, source IP)."""
    if user.type == UserType.SUPER:
        return Verdict(True)
    best: tuple[int, int] | None = None
    chosen: PolicyEntry | None = None
    for entry in entries:
        if not entry.covers(action, source_ip):
            continue
        rank = entry.resource.rank(resource)
        if rank is None:
            continue
        if best is None or rank > best or (rank == best and entry.decision == Decision.DENY):
            best, chosen = rank, entry
    if chosen is None:
        return Verdict(False)
    return Verdict(chosen.decision == Decision.ALLOW, chosen)
