"""Topics as clients see them: routes, auto-creation, message types.

A route lists a topic's queues with one broker (id 0, the only "master" a
client uses) whose endpoints are every node's client address: any node serves
any client, a follower forwarding to the leader, so a client keeps working
through a failover without a new route.

Topics are created through the replicated log (MessageStore.update_topic), on
the leader; the system topics the broker writes itself (retry, dead-letter,
the transaction half topic, the timer topic) are created the first time they
are needed, like RocketMQ does.
"""
from __future__ import annotations

import ipaddress
import logging

from broker.config import BrokerConfig
from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.message_store import MessageStore
from store.topic_config import MESSAGE_TYPE_ATTRIBUTE, PERM_READ, PERM_WRITE, TopicConfig

log = logging.getLogger(__name__)

# message.type attribute -> what a queue of the topic accepts.
ACCEPTED_TYPES: dict[str, list[int]] = {
    "NORMAL": [pb.NORMAL],
    "FIFO": [pb.FIFO],
    "DELAY": [pb.DELAY],
    "TRANSACTION": [pb.TRANSACTION],
    "MIXED": [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
}
TYPE_NAMES = {pb.NORMAL: "NORMAL", pb.FIFO: "FIFO", pb.DELAY: "DELAY", pb.TRANSACTION: "TRANSACTION"}

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    return f"{RETRY_PREFIX}{group}"


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


class TopicService:
    def __init__(self, config: BrokerConfig, store: MessageStore) -> None:
        self.config = config
        self.store = store
        self._endpoints = route_endpoints(config.client_endpoints)

    def get(self, topic: str) -> TopicConfig | None:
        return self.store.topics.get(topic)

    async def ensure(self, topic: str, queues: int | None = None, message_type: str = "MIXED",
                     auto: bool = True) -> TopicConfig:
        """The topic's config, creating it (through the log, on the leader) when
        it is missing and creation is allowed; TOPIC_NOT_FOUND otherwise."""
        config = self.get(topic)
        if config is not None:
            return config
        if not auto:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist and auto-creation is off")
        count = queues or self.config.default_queue_nums
        config = TopicConfig(topic, read_queue_nums=count, write_queue_nums=count,
                             attributes={MESSAGE_TYPE_ATTRIBUTE: message_type})
        await self.store.update_topic(config)
        log.info("created topic %s with %d queues (%s)", topic, count, message_type)
        return self.get(topic) or config

    async def ensure_for_send(self, topic: str) -> TopicConfig:
        return await self.ensure(topic, auto=self.config.auto_create_topic)

    async def ensure_system(self, topic: str, queues: int = 1) -> TopicConfig:
        """Retry, dead-letter and internal topics: always created on demand."""
        return await self.ensure(topic, queues, auto=True)

    # ----------------------------------------------------------------- routes
    def route(self, topic: str) -> list[pb.MessageQueue]:
        config = self.get(topic)
        if config is None:
            raise BrokerError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return self.queues_of(config)

    def queues_of(self, config: TopicConfig) -> list[pb.MessageQueue]:
        broker = pb.Broker(name=self.config.broker_name, id=0, endpoints=self._endpoints)
        return message_queues(config.topic_name, config.read_queue_nums, config.write_queue_nums, config.perm,
                              config.message_type, broker)

    def check_type(self, config: TopicConfig, message_type: int) -> None:
        accepted = ACCEPTED_TYPES.get(config.message_type, ACCEPTED_TYPES["MIXED"])
        if message_type not in accepted:
            raise BrokerError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                              f"topic {config.topic_name!r} takes {config.message_type} messages, not "
                              f"{TYPE_NAMES.get(message_type, message_type)}")


def message_queues(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int, message_type: str,
                   broker: pb.Broker) -> list[pb.MessageQueue]:
    """A topic's queues in one broker group, as a route lists them."""
    accepted = ACCEPTED_TYPES.get(message_type, ACCEPTED_TYPES["MIXED"])
    queues = []
    for queue_id in range(max(read_queue_nums, write_queue_nums)):
        readable = queue_id < read_queue_nums and perm & PERM_READ
        writable = queue_id < write_queue_nums and perm & PERM_WRITE
        permission = (pb.READ_WRITE if readable and writable else pb.READ if readable
                      else pb.WRITE if writable else pb.NONE)
        queues.append(pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id, permission=permission,
                                      broker=broker, accept_message_types=accepted))
    return queues


def route_endpoints(addresses: tuple[str, ...]) -> pb.Endpoints:
    """Endpoints for a route. IP addresses go as IPv4 (or IPv6); host names as
    DOMAIN_NAME, which the official client accepts only with one address, so
    then only the first is listed."""
    parsed = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        parsed.append((host.strip("[]"), int(port)))
    kinds = {_ip_version(host) for host, _ in parsed}
    if kinds == {4}:
        scheme = pb.IPv4
    elif kinds == {6}:
        scheme = pb.IPv6
    else:
        scheme, parsed = pb.DOMAIN_NAME, parsed[:1]
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=h, port=p) for h, p in parsed])


def _ip_version(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0
