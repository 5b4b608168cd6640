"""RouteTable: what a name server knows of the broker groups (RocketMQ's
RouteInfoManager), with every rule as a plain method that takes the time.

A group (broker name = its DLedger group) is known by what its leader last
registered: its nodes (the leader is broker id 0), its topic configs, its
DLedger term and when that was. Rules:

- A registration must come from the group's leader as it describes itself:
  the sending node is listed, with broker id 0, once; names are legal.
- A node that is a live member of another group cannot register this one
  (a node claiming a group it is not in).
- A live group is only taken over by a registration of a node it lists, or
  by a higher term from a node list that shares a member with the known one
  (a membership change that put a new node in the lead); an older term
  loses (a deposed leader's late registration must not bring back the old
  node roles).
- A group not heard from for `expiry_s` is dropped by `expire` (the
  scanner's decision); the leader unregisters it when it shuts down.

These rules catch misconfiguration, as RocketMQ's name server does; who
may register at all is decided before them (namesrv/access.py: on a
secured name server, members of the cluster only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from broker.errors import BrokerError
from broker.validation import NAME_PATTERN
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

# RocketMQ's default topic: brokers that allow auto-creation register it, and
# a route for an unknown topic is taken from its route.
DEFAULT_TOPIC = "TBW102"
DEFAULT_EXPIRY_S = 120.0                   # RocketMQ: BROKER_CHANNEL_EXPIRED_TIME
MESSAGE_TYPES = frozenset({"NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"})
MAX_NAME_CHARS = 127
MAX_QUEUES = 1024
MAX_NODES = 64
LEADER_BROKER_ID = 0


@dataclass(frozen=True)
class NodeInfo:
    id: str
    address: str
    broker_id: int
    role: str


@dataclass(frozen=True)
class TopicRouteData:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str


@dataclass(frozen=True)
class Registration:
    cluster_name: str
    broker_name: str
    node_id: str
    term: int
    nodes: tuple[NodeInfo, ...]
    topics: tuple[TopicRouteData, ...]
    # A secured group's users and ACLs (namesrv/access.py); empty otherwise.
    auth_metadata: bytes = b""


@dataclass
class GroupRecord:
    cluster_name: str
    broker_name: str
    term: int
    leader_id: str
    nodes: tuple[NodeInfo, ...]
    topics: dict[str, TopicRouteData]
    last_update: float                     # monotonic, for expiry
    last_update_wall_ms: int = 0           # for people
    auth_metadata: bytes = b""

    @property
    def leader(self) -> NodeInfo:
        return next(n for n in self.nodes if n.broker_id == LEADER_BROKER_ID)


@dataclass
class RouteTable:
    expiry_s: float = DEFAULT_EXPIRY_S
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    # Groups dropped by expire() so far (a metric).
    expired_total: int = 0

    # ------------------------------------------------------------ register
    def register(self, registration: Registration, now: float) -> GroupRecord:
        """Record a group's registration; BrokerError (with the code a client
        reads) when it is malformed or claims what it may not."""
        check_registration(registration)
        self.expire(now)
        self._check_claim(registration)
        record = GroupRecord(registration.cluster_name, registration.broker_name, registration.term,
                             registration.node_id, registration.nodes,
                             {t.topic: t for t in registration.topics}, now, int(time.time() * 1000),
                             registration.auth_metadata)
        self.groups[registration.broker_name] = record
        return record

    def _check_claim(self, registration: Registration) -> None:
        me = next(n for n in registration.nodes if n.id == registration.node_id)
        for other in self.groups.values():
            if other.broker_name == registration.broker_name:
                continue
            if any(n.address == me.address for n in other.nodes):
                raise BrokerError(pb.FORBIDDEN, f"node {me.id} at {me.address} is a member of group "
                                                f"{other.broker_name!r}, not of {registration.broker_name!r}")
        known = self.groups.get(registration.broker_name)
        if known is None:
            return
        if registration.term < known.term:
            raise BrokerError(pb.FORBIDDEN, f"group {known.broker_name!r} is led by {known.leader_id} in term "
                                            f"{known.term}; a registration of term {registration.term} is stale")
        members = {(n.id, n.address) for n in known.nodes}
        if (me.id, me.address) in members:
            if registration.term == known.term and me.id != known.leader_id:
                raise BrokerError(pb.FORBIDDEN, f"group {known.broker_name!r} is led by {known.leader_id} in "
                                                f"term {known.term}, not by {me.id}")
            return
        shares_member = any((n.id, n.address) in members for n in registration.nodes)
        if registration.term > known.term and shares_member:
            return
        raise BrokerError(pb.FORBIDDEN, f"node {me.id} at {me.address} is not a member of group "
                                        f"{known.broker_name!r} (members: "
                                        f"{', '.join(f'{i}={a}' for i, a in sorted(members))})")

    def unregister(self, broker_name: str, node_id: str, term: int) -> bool:
        """Drop a group on its leader's word; another node's (or an older
        term's) word leaves it alone."""
        known = self.groups.get(broker_name)
        if known is None or known.leader_id != node_id or term < known.term:
            return False
        del self.groups[broker_name]
        return True

    # -------------------------------------------------------------- lookups
    def expire(self, now: float) -> list[str]:
        """Drop groups not heard from for expiry_s; their names."""
        gone = [name for name, g in self.groups.items() if now - g.last_update > self.expiry_s]
        for name in gone:
            del self.groups[name]
        self.expired_total += len(gone)
        return gone

    def route(self, topic: str, now: float) -> list[tuple[GroupRecord, TopicRouteData]]:
        """Every live group holding `topic`, by broker name."""
        self.expire(now)
        return [(g, g.topics[topic]) for _, g in sorted(self.groups.items()) if topic in g.topics]

    def live_groups(self, now: float) -> list[GroupRecord]:
        self.expire(now)
        return [g for _, g in sorted(self.groups.items())]


# ------------------------------------------------------------------- checks

def check_name(name: str, what: str) -> None:
    if not name or len(name) > MAX_NAME_CHARS or not NAME_PATTERN.match(name):
        raise BrokerError(pb.BAD_REQUEST, f"the {what} {name!r} must be 1..{MAX_NAME_CHARS} letters, digits, "
                                          "'%', '|', '_' or '-'")


def check_address(address: str, what: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BrokerError(pb.BAD_REQUEST, f"the {what} {address!r} is not HOST:PORT")


def check_registration(registration: Registration) -> None:
    check_name(registration.cluster_name, "cluster name")
    check_name(registration.broker_name, "broker name")
    check_name(registration.node_id, "node id")
    if registration.term < 0:
        raise BrokerError(pb.BAD_REQUEST, f"the term {registration.term} is negative")
    nodes = registration.nodes
    if not nodes or len(nodes) > MAX_NODES:
        raise BrokerError(pb.BAD_REQUEST, f"a group lists 1..{MAX_NODES} nodes, not {len(nodes)}")
    for node in nodes:
        check_name(node.id, "node id")
        check_address(node.address, f"address of {node.id}")
    if len({n.id for n in nodes}) != len(nodes) or len({n.broker_id for n in nodes}) != len(nodes):
        raise BrokerError(pb.BAD_REQUEST, "node ids and broker ids must be unique within a group")
    leaders = [n for n in nodes if n.broker_id == LEADER_BROKER_ID]
    if len(leaders) != 1 or leaders[0].id != registration.node_id:
        raise BrokerError(pb.FORBIDDEN, f"node {registration.node_id} does not lead group "
                                        f"{registration.broker_name!r} by its own registration (the "
                                        "sender must be listed with broker id 0)")
    seen: set[str] = set()
    for topic in registration.topics:
        check_topic_config(topic)
        if topic.topic in seen:
            raise BrokerError(pb.BAD_REQUEST, f"topic {topic.topic!r} is listed twice")
        seen.add(topic.topic)


def check_topic_config(topic: TopicRouteData) -> None:
    check_name(topic.topic, "topic")
    for what, count in (("read", topic.read_queue_nums), ("write", topic.write_queue_nums)):
        if not 0 <= count <= MAX_QUEUES:
            raise BrokerError(pb.BAD_REQUEST, f"topic {topic.topic!r}: {count} {what} queues is outside "
                                              f"0..{MAX_QUEUES}")
    if not 0 <= topic.perm <= 7:
        raise BrokerError(pb.BAD_REQUEST, f"topic {topic.topic!r}: permission bits {topic.perm} outside 0..7")
    if topic.message_type not in MESSAGE_TYPES:
        raise BrokerError(pb.BAD_REQUEST, f"topic {topic.topic!r}: message type {topic.message_type!r} is not "
                                          f"one of {', '.join(sorted(MESSAGE_TYPES))}")
