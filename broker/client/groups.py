"""Broker groups as a client sees them: one connection per group, queue
selection across groups, and the isolation of a group that failed
(RocketMQ's MQFaultStrategy and LatencyFaultTolerance).

A route lists a topic's queues in every group holding it; each queue names
its group (broker name) and that group's endpoints. The client keeps one
Connection per group (it finds that group's leader itself) under the same
client id, sends each call to the group of the queue it picked, and acks a
message to the group it came from.

The decisions are plain functions and a small class that take the time:
- `pick_group`: round robin over the groups holding writable queues,
  skipping the group that just failed (`last_broker`, the seeds'
  selectOneMessageQueue(lastBrokerName)) and groups isolated by
  `FaultTolerance`; when every group is excluded, the one whose isolation
  ends first (pickOneAtLeast).
- `fifo_group`: a message group always goes to the same group (and the
  broker keeps it on one queue there), so its order holds.
- `FaultTolerance`: a failed group is avoided for a back-off window that
  doubles with each consecutive failure (from `base_s` to `max_s`); a
  success ends it.
"""
from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from broker.client.config import ClientConfig
from broker.client.connection import Connection
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

ISOLATION_BASE_S = 1.0
ISOLATION_MAX_S = 30.0


@dataclass
class FaultTolerance:
    base_s: float = ISOLATION_BASE_S
    max_s: float = ISOLATION_MAX_S
    # broker name -> (isolated until, consecutive failures)
    _faults: dict[str, tuple[float, int]] = field(default_factory=dict)

    def failed(self, name: str, now: float) -> float:
        """Isolate `name`; returns the window's length."""
        _, failures = self._faults.get(name, (0.0, 0))
        window = min(self.max_s, self.base_s * (2 ** failures))
        self._faults[name] = (now + window, failures + 1)
        return window

    def succeeded(self, name: str) -> None:
        self._faults.pop(name, None)

    def available(self, name: str, now: float) -> bool:
        until, _ = self._faults.get(name, (0.0, 0))
        return now >= until

    def isolated_until(self, name: str) -> float:
        return self._faults.get(name, (0.0, 0))[0]


def writable_groups(queues: Iterable[pb.MessageQueue]) -> list[str]:
    """Broker names with a writable queue (broker id 0 only), sorted: every
    client (and every run) sees the same order."""
    return sorted({q.broker.name for q in queues
                   if q.broker.id == 0 and q.permission in (pb.WRITE, pb.READ_WRITE)})


def pick_group(groups: Sequence[str], turn: int, faults: FaultTolerance, now: float,
               last_broker: str | None = None) -> str:
    """The group for the next send (see the module docstring)."""
    if not groups:
        raise ValueError("no group to pick from")
    for step in range(len(groups)):
        name = groups[(turn + step) % len(groups)]
        if name != last_broker and faults.available(name, now):
            return name
    others = [g for g in groups if g != last_broker] or list(groups)
    return min(others, key=faults.isolated_until)


def fifo_group(groups: Sequence[str], message_group: str) -> str:
    """The group a message group's messages go to, stable for a set of groups."""
    return groups[zlib.crc32(message_group.encode("utf-8")) % len(groups)]


def endpoints_addresses(endpoints: pb.Endpoints) -> tuple[str, ...]:
    return tuple(f"[{a.host}]:{a.port}" if ":" in a.host else f"{a.host}:{a.port}" for a in endpoints.addresses)


class GroupConnections:
    """One Connection per broker group, created from a route's endpoints on
    first use and shared by sends, receives and acks."""

    def __init__(self, config: ClientConfig, client_id: str) -> None:
        self.config = config
        self.client_id = client_id
        self._connections: dict[str, Connection] = {}
        self.faults = FaultTolerance()

    def get(self, queue: pb.MessageQueue) -> Connection:
        name = queue.broker.name
        connection = self._connections.get(name)
        if connection is None:
            config = ClientConfig.of(endpoints_addresses(queue.broker.endpoints), **{
                k: v for k, v in self.config.__dict__.items() if k != "servers"})
            connection = self._connections[name] = Connection(config, self.client_id, name)
        return connection

    def by_name(self, name: str) -> Connection | None:
        return self._connections.get(name)

    @property
    def retries(self) -> int:
        return sum(c.retries for c in self._connections.values())

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
