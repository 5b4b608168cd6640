"""BrokerConfig: the messaging layer's tunables, each default explained once."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerConfig:
    # The broker's name in routes: the DLedger group it serves (RocketMQ's
    # brokerName, which for a DLedger broker is its dLegerGroup).
    broker_name: str
    # Where clients reach every node (host:port, the advertised addresses). A
    # route lists them all: any node serves a client (a follower forwards to
    # the leader), so a client needs no new route after a failover.
    endpoints: tuple[str, ...]
    # A send to an unknown topic creates it (RocketMQ: autoCreateTopicEnable
    # true by default, "recommended off in production"); off, the send fails
    # with TOPIC_NOT_FOUND.
    auto_create_topic: bool = True
    auto_create_group: bool = True
    default_queue_nums: int = 8                # BrokerConfig.defaultTopicQueueNums
    max_body_size: int = 4 << 20
    # A follower forwards writes to the leader; during an election it waits
    # up to this long for one before answering HA_NOT_AVAILABLE.
    leader_wait_s: float = 3.0
    forward_timeout_s: float = 10.0
    # Message ids remembered for send retries (a producer retries with the
    # same id; a repeat is answered with the original receipt).
    dedupe_capacity: int = 200_000
