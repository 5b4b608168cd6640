"""What a consumer learns from the broker's Telemetry settings: the group's
retry policy (max attempts and the backoff a push consumer waits before it
nacks a failed message back), whether the group is FIFO, and the receive
batch limit."""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

from broker.clients import ClientRegistry
from broker.validation import DEFAULT_LIMITS as LIMITS
from broker.consumer.config import ConsumerConfig
from broker.consumer.receive import max_attempts
from broker.messages import to_duration
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.subscription_group import SubscriptionGroupConfig, SubscriptionGroupManager

# RocketMQ's retry ladder for concurrent consumption: retry n waits RETRY_LADDER[n-1].
RETRY_LADDER = tuple(timedelta(seconds=s) for s in (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200))


def retry_policy(group: SubscriptionGroupConfig, config: ConsumerConfig) -> pb.RetryPolicy:
    """FIFO groups retry at a fixed interval (the messages behind wait);
    others climb the ladder."""
    ladder = (config.fifo_retry_interval,) if group.consume_message_orderly else RETRY_LADDER
    return pb.RetryPolicy(max_attempts=max_attempts(group),
                          customized_backoff=pb.CustomizedBackoff(next=[to_duration(d) for d in ladder]))


def subscription_settings(groups: SubscriptionGroupManager, config: ConsumerConfig
                          ) -> Callable[[pb.Settings], pb.Settings]:
    def fill(settings: pb.Settings) -> pb.Settings:
        name = settings.subscription.group.name
        group = groups.get(name) or SubscriptionGroupConfig(name)
        settings.backoff_policy.CopyFrom(retry_policy(group, config))
        settings.subscription.fifo = group.consume_message_orderly
        batch = settings.subscription.receive_batch_size
        settings.subscription.receive_batch_size = min(batch, config.max_batch_size) if batch > 0 \
            else config.max_batch_size
        # A push consumer polls as long as the broker says (and gives each
        # receive that plus its request timeout): without it, it would poll
        # for zero seconds with a deadline too short to be served.
        asked = settings.subscription.long_polling_timeout.ToTimedelta() \
            if settings.subscription.HasField("long_polling_timeout") else LIMITS.max_long_polling
        polling = min(max(asked, LIMITS.min_long_polling), LIMITS.max_long_polling)
        settings.subscription.long_polling_timeout.CopyFrom(to_duration(polling))
        return settings
    return fill


# The official clients' request timeout (ClientConfiguration.request_timeout).
DEFAULT_REQUEST_TIMEOUT = timedelta(seconds=3)


def request_timeout_of(clients: ClientRegistry, client_id: str) -> timedelta:
    """The request timeout a client announced in its settings: a long poll
    without its own timeout leaves it half of that to spare."""
    session = clients.sessions.get(client_id)
    if session is None or session.settings is None or not session.settings.HasField("request_timeout"):
        return DEFAULT_REQUEST_TIMEOUT
    return session.settings.request_timeout.ToTimedelta()
