"""BrokerConfig: the messaging layer's tunables, each default explained once.

A node takes them from the `[broker]` table of its TOML file (keys are these
field names; cluster/config.py), except the name and endpoints, which follow
from the DLedger group and its peers."""
from __future__ import annotations

from dataclasses import dataclass

from dledger.config import PeerAddress
from store.config import MessageStoreConfig


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
    # Front ends (RocketMQ 5's proxy, inside the nodes): a second client
    # port per node that serves the messaging protocol only and forwards to
    # whichever node leads, holding calls through leader changes. A node
    # closes its front end while it leads (clients then move, on their own
    # connection's GOAWAY, to a node that does not), so killing or pausing
    # the leader cuts no client connection. Routes then list these
    # addresses instead of `endpoints`. Empty: no front ends.
    front_ends: tuple[PeerAddress, ...] = ()
    # Where this node's front end binds, when not its own front-end address
    # (0.0.0.0:PORT in a container).
    front_end_listen_address: str = ""
    # A front end closing because its node now leads lets calls in flight on
    # it (Telemetry streams above all) run this long before they are cut;
    # its long polls end at once, answered empty.
    front_end_drain_s: float = 30.0
    auto_create_topic: bool = True
    # For a log written before entries carried their writer in the DLedger
    # header's channel: apply untagged entries shaped like store entries
    # (store/config.py). Every node alike, or none.
    legacy_untagged_entries: bool = False
    # The leader's decoded newest committed messages, for consumers at the
    # tail (store/hot_messages.py); the store's default.
    hot_message_bytes: int = MessageStoreConfig.hot_message_bytes
    auto_create_group: bool = True
    default_queue_nums: int = 8                # BrokerConfig.defaultTopicQueueNums
    max_body_size: int = 4 << 20
    # A follower forwards writes to the leader; during an election it waits
    # up to this long for one before answering HA_NOT_AVAILABLE.
    leader_wait_s: float = 3.0
    forward_timeout_s: float = 10.0
    # Forwarded unary calls of the messaging service share one stream to the
    # leader (broker/relay.py) instead of a gRPC call each.
    relay_forwarded_calls: bool = True
    # Send retries are recognised by message id (a producer retries with the
    # same id; a repeat is answered with the original receipt) for the
    # messages of this many last entries of the log: a window of the log
    # alone, so every replica, and a node restarted from its checkpoint, has
    # the same one.
    dedupe_window_entries: int = 200_000

    @property
    def client_endpoints(self) -> tuple[str, ...]:
        """The addresses a route gives clients: the front ends when there
        are any, else every node."""
        return tuple(p.address for p in self.front_ends) or self.endpoints

    def front_end_of(self, node_id: str) -> str:
        """Node `node_id`'s front-end address ("" without one)."""
        return next((p.address for p in self.front_ends if p.id == node_id), "")

    # ------------------------------------------- broker groups and name servers
    # Name servers (host:port) this group registers with; empty: a single
    # group, which needs none (routes list this group only).
    namesrv_addrs: tuple[str, ...] = ()
    # RocketMQ's brokerClusterName: groups of one cluster register under it.
    cluster_name: str = "DefaultCluster"
    # The leader registers the group this often (RocketMQ: every 30 s), and at
    # once on becoming leader and on each change of topics or members.
    register_interval_s: float = 30.0
    # One call to a name server.
    namesrv_timeout_s: float = 3.0

    # ------------------------------------------------- delayed and timed messages
    # The furthest a delivery timestamp may lie ahead (ProxyConfig.maxDelayTimeMills, 1 day).
    max_delay_s: float = 86400.0
    # RocketMQ's delay levels 1..18 (MessageStoreConfig.messageDelayLevel); a
    # level above the last means the last.
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # Due messages moved to their topics per append: one put carries many, so
    # a burst of timers due together costs a few round trips, not thousands.
    timer_batch_size: int = 256

    # ------------------------------------------------------------- transactions
    # When a half message is first checked back if its producer named no
    # orphaned_transaction_recovery_duration (BrokerConfig.transactionTimeOut, 6 s).
    transaction_timeout_s: float = 6.0
    # Between two check-backs of one half message (BrokerConfig.transactionCheckInterval, 30 s).
    transaction_check_interval_s: float = 30.0
    # Check-backs before an undecided half message is rolled back (transactionCheckMax).
    transaction_check_max: int = 15
    # A producer's recovery duration is capped here (ProxyConfig.maxTransactionRecoverySecond, 1 h).
    max_transaction_recovery_s: float = 3600.0
    # A half message still undecided this long after it was stored is rolled
    # back even if fewer checks reached a producer (the 5.x documentation's
    # maximum half-message lifetime, 4 h): only checks a connected producer
    # was sent count toward transaction_check_max, so without this a half
    # whose producer never comes back would wait forever.
    transaction_max_lifetime_s: float = 4 * 3600.0
