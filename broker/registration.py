"""BrokerRegistrar: the group's leader registers the group with every name
server (RocketMQ's registerBrokerAll), so that clients and the nodes of
other groups find its topics.

With auth on, a registration also carries the group's users and ACLs (a
change of them registers at once), so that a secured name server answers
route queries as the group would; it goes only over the members' channel.

The group's leader registers at once when it becomes leader and ready (the
name servers see a leader change within a poll, 0.1 s), whenever its topics
or members change, and every register interval; a registration that failed
is tried again a second later. A follower registers nothing: the leader of
the next term supersedes the old one's registration by its higher term. On
a clean shutdown the leader unregisters the group, and the next leader
registers it again as soon as it is elected.

When to register is a plain function (`registration_due`) of what was last
sent to that name server; the task only polls and calls.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import grpc

from broker import validation
from broker.auth.metadata import AuthMetadataManager
from broker.config import BrokerConfig
from broker.leadership import LeaderGate
from broker.namesrv_client import NameServerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from store.topic_config import PERM_READ_WRITE

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "TBW102"
POLL_S = 0.1
# After a failed registration (a name server down or restarting).
RETRY_S = 1.0
Observer = Callable[[bool], None]


@dataclass(frozen=True)
class Sent:
    fingerprint: Hashable
    at: float
    ok: bool


def registration_due(last: Sent | None, fingerprint: Hashable, now: float, interval_s: float,
                     retry_s: float = RETRY_S) -> bool:
    """Whether a name server should get a registration now."""
    if last is None or last.fingerprint != fingerprint:
        return True
    return now - last.at >= (interval_s if last.ok else min(retry_s, interval_s))


def registered(topic: str) -> bool:
    """Topics clients may route to: every topic but the broker's internal
    ones (retry and dead-letter topics are routed, as RocketMQ registers them,
    so that a dead-letter queue can be read from every group)."""
    return not (topic in validation.SYSTEM_TOPICS or topic.startswith(validation.SYSTEM_TOPIC_PREFIX))


class BrokerRegistrar:
    def __init__(self, config: BrokerConfig, gate: LeaderGate, names: NameServerClient,
                 observer: Observer | None = None, auth_metadata: AuthMetadataManager | None = None) -> None:
        self.config = config
        # With auth on: the users and ACLs sent along (namesrv/access.py).
        self.auth_metadata = auth_metadata
        self.gate = gate
        self.server = gate.server
        self.store = gate.store
        self.names = names
        self.observer = observer or (lambda ok: None)
        self._sent: dict[str, Sent] = {}
        self.registered_term: int | None = None

    # -------------------------------------------------------------- payload
    def fingerprint(self, term: int) -> Hashable:
        members = tuple((p.id, p.role) for p in self.server.membership.current.members)
        auth = self.auth_metadata.applied_index if self.auth_metadata is not None else None
        return term, self.store.topics.applied_index, members, len(self.store.topics.topics), auth

    def request(self, term: int) -> npb.RegisterBrokerRequest:
        server = self.server
        self_id = server.config.self_id
        others = sorted(p.id for p in server.membership.current.members if p.id != self_id)
        nodes = [npb.BrokerNode(id=self_id, address=server.client_address_of(self_id), broker_id=0, role="LEADER")]
        nodes += [npb.BrokerNode(id=node_id, address=server.client_address_of(node_id), broker_id=i + 1,
                                 role="FOLLOWER") for i, node_id in enumerate(others)]
        topics = [npb.TopicRouteConfig(topic=c.topic_name, read_queue_nums=c.read_queue_nums,
                                       write_queue_nums=c.write_queue_nums, perm=c.perm,
                                       message_type=c.message_type)
                  for name, c in sorted(self.store.topics.topics.items()) if registered(name)]
        if self.config.auto_create_topic:
            # The default topic's route is where unknown topics are created.
            queues = self.config.default_queue_nums
            topics.append(npb.TopicRouteConfig(topic=DEFAULT_TOPIC, read_queue_nums=queues,
                                               write_queue_nums=queues, perm=PERM_READ_WRITE,
                                               message_type="MIXED"))
        auth = json.dumps(self.auth_metadata.encode(), separators=(",", ":")).encode() \
            if self.auth_metadata is not None else b""
        return npb.RegisterBrokerRequest(cluster_name=self.config.cluster_name,
                                         broker_name=self.config.broker_name, node_id=self_id, term=term,
                                         nodes=nodes, topics=topics, auth_metadata=auth)

    # ----------------------------------------------------------------- task
    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            term = self.gate.ready_term()
            if term is None:
                self._sent.clear()
                self.registered_term = None
                continue
            await self.register_due(term)

    async def register_due(self, term: int) -> None:
        fingerprint, now = self.fingerprint(term), time.monotonic()
        due = [a for a in self.names.addresses
               if registration_due(self._sent.get(a), fingerprint, now, self.config.register_interval_s)]
        if not due:
            return
        request = self.request(term)
        results = await asyncio.gather(*(self._register(a, request) for a in due))
        for address, ok in zip(due, results):
            self._sent[address] = Sent(fingerprint, now, ok)
        if any(results):
            self.registered_term = term

    async def _register(self, address: str, request: npb.RegisterBrokerRequest) -> bool:
        try:
            answer = await self.names.stub(address).RegisterBroker(request, timeout=self.config.namesrv_timeout_s)
        except grpc.aio.AioRpcError as error:
            log.debug("registration with %s failed: %s", address, error.code().name)
            self.observer(False)
            return False
        if answer.status.code != pb.OK:
            log.warning("name server %s refused the registration of %s: %s", address, request.broker_name,
                        answer.status.message)
            self.observer(False)
            return False
        if self._sent.get(address) is None:
            log.info("registered group %s (term %d, %d topics) with %s", request.broker_name, request.term,
                     len(request.topics), address)
        self.observer(True)
        return True

    async def unregister(self) -> None:
        """On a clean shutdown of the leader: withdraw the group at once
        rather than leave clients a route to a node that is gone."""
        term = self.registered_term
        if term is None or not self.server.member_state.is_leader:
            return
        request = npb.UnregisterBrokerRequest(broker_name=self.config.broker_name,
                                              node_id=self.server.config.self_id, term=term)

        async def one(address: str) -> None:
            try:
                await self.names.stub(address).UnregisterBroker(request, timeout=1.0)
            except grpc.aio.AioRpcError as error:
                log.debug("unregistering from %s failed: %s", address, error.code().name)

        await asyncio.gather(*(one(a) for a in self.names.addresses))
