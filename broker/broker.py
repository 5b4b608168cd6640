"""Broker: the messaging services of one node, assembled (RocketMQ's
BrokerController, less the start-up, which cluster/node.py does)."""
from __future__ import annotations

import asyncio
import logging

from broker import validation
from broker.auth.metadata import AuthMetadataManager
from broker.clients import ClientRegistry
from broker.cluster_routes import ClusterRoutes
from broker.config import BrokerConfig
from broker.consumer import ConsumerService
from broker.errors import BrokerError
from broker.forwarding import LeaderForwarder
from broker.leadership import LeaderGate
from broker.namesrv_client import NameServerClient
from broker.registration import BrokerRegistrar, Observer
from broker.send import SendService
from broker.timer.service import TimerService
from broker.topics import TopicService
from broker.transaction.service import TransactionService
from dledger.rpc.tls import PLAINTEXT, TlsMaterial
from dledger.server import DLedgerServer
from dledger.tasks import start_task
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig, store: MessageStore, server: DLedgerServer,
                 tls: TlsMaterial = PLAINTEXT, registration_observer: Observer | None = None,
                 signing: tuple[str, str] | None = None) -> None:
        """`tls`: the node's certificate and the cluster CA (name servers'
        members port, other groups' client ports); `signing`: the bootstrap
        super user's (name, secret) when auth is on, for the calls this node
        makes to name servers and other groups."""
        self.config = config
        self.store = store
        self.server = server
        self.topics = TopicService(config, store)
        self.clients = ClientRegistry(config)
        gate = LeaderGate(server, store)
        # Both register state machines with the store: built before it starts.
        self.timers = TimerService(config, store, self.topics, gate)
        self.transactions = TransactionService(config, store, self.topics, self.clients, gate)
        self.sender = SendService(config, store, self.topics, self.timers, self.transactions)
        self.forwarder = LeaderForwarder(server, config, tls, signing)
        self.consumer = ConsumerService(store, self.topics, self.clients, self.ensure_group)
        # Users and ACLs are replicated whether or not this node enforces
        # them, so that turning auth on finds every node agreeing.
        self.auth_metadata = AuthMetadataManager(store.config.config_dir)
        store.add_manager(self.auth_metadata)
        self._tasks: list[asyncio.Task[None]] = []
        # Broker groups (broker/registration.py, broker/cluster_routes.py):
        # only with name servers; a single group needs none.
        self.names: NameServerClient | None = None
        self.registrar: BrokerRegistrar | None = None
        self.cluster_routes: ClusterRoutes | None = None
        if config.namesrv_addrs:
            self.names = NameServerClient(config.namesrv_addrs, config.namesrv_timeout_s, tls, signing)
            # A secured group's users and ACLs go with its registrations, so
            # that a name server answers route queries as this group would.
            self.registrar = BrokerRegistrar(config, gate, self.names, registration_observer,
                                             self.auth_metadata if signing else None)
            self.cluster_routes = ClusterRoutes(config, self.topics, self.names, tls, signing)

    async def start(self) -> None:
        # On every node; each acts only while its node leads (broker/leadership.py).
        self._tasks = [start_task(self.timers.run(), "TimerDeliverer"),
                       start_task(self.transactions.run(), "TransactionChecker"),
                       start_task(self.sender.rebuild_recent(), "MessageIdRebuild")]
        if self.registrar is not None:
            self._tasks.append(start_task(self.registrar.run(), "BrokerRegistrar"))
        for task in self._tasks:
            task.add_done_callback(_report_death)
        await self.consumer.start()
        log.info("broker %s serving, endpoints %s", self.config.broker_name, ",".join(self.config.endpoints))

    async def stop(self) -> None:
        if self.registrar is not None:
            await self.registrar.unregister()
        await self.consumer.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.forwarder.close()
        if self.names is not None:
            await self.names.close()

    async def ensure_group(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, created with RocketMQ's defaults when missing
        (autoCreateSubscriptionGroup), through the log on the leader."""
        validation.validate_consumer_group(group)
        config = self.store.groups.get(group)
        if config is None:
            if not self.config.auto_create_group:
                raise BrokerError(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist")
            config = SubscriptionGroupConfig(group)
            await self.store.update_group(config)
            log.info("created consumer group %s", group)
        return config


def _report_death(task: asyncio.Task[None]) -> None:
    """A broker task ends only when cancelled; anything else stops timers or
    checks on this node and must be seen, not swallowed at shutdown."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("%s stopped: %r", task.get_name(), task.exception(), exc_info=task.exception())
