"""Broker: the messaging services of one node, assembled (RocketMQ's
BrokerController, less the start-up, which cluster/node.py does)."""
from __future__ import annotations

import logging

from broker import validation
from broker.clients import ClientRegistry
from broker.config import BrokerConfig
from broker.consumer import ConsumerService
from broker.errors import BrokerError
from broker.forwarding import LeaderForwarder
from broker.send import SendService
from broker.topics import TopicService
from dledger.server import DLedgerServer
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig, store: MessageStore, server: DLedgerServer) -> None:
        self.config = config
        self.store = store
        self.server = server
        self.topics = TopicService(config, store)
        self.sender = SendService(config, store, self.topics)
        self.clients = ClientRegistry(config)
        self.forwarder = LeaderForwarder(server, config)
        self.consumer = ConsumerService(store, self.topics, self.clients, self.ensure_group)

    async def start(self) -> None:
        await self.consumer.start()
        log.info("broker %s serving, endpoints %s", self.config.broker_name, ",".join(self.config.endpoints))

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.forwarder.close()

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
