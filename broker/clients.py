"""Client sessions: who is connected, with which settings, and how to reach them.

A RocketMQ 5 client opens a Telemetry stream to the broker and sends its
settings; the broker answers with the authoritative settings (the producer
takes its maximum body size and message type checks from them; consumers their
retry policy). The stream stays open so that the broker can push commands:
the transaction check-back of an orphaned half message goes to a producer of
its topic this way. Followers forward Telemetry to the leader, so the
leader's registry holds every session.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import AsyncIterator, Awaitable, Callable

from broker.config import BrokerConfig
from broker.messages import to_duration
from broker.status import ok
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

log = logging.getLogger(__name__)

# A producer's retries (the 5.x proxy's defaults: 3 attempts, 10 ms doubling to 1 s).
PRODUCER_BACKOFF = pb.RetryPolicy(max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
    initial=to_duration(timedelta(milliseconds=10)), max=to_duration(timedelta(seconds=1)), multiplier=2.0))

# Consumer settings: SubscriptionRules come from the group's config; this
# callback builds them (the consumer service owns the retry policy).
SubscriptionSettings = Callable[[pb.Settings], pb.Settings]


@dataclass
class ClientSession:
    client_id: str
    settings: pb.Settings | None = None
    outbox: asyncio.Queue[spb.TelemetryCommand | None] = field(default_factory=asyncio.Queue)
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def client_type(self) -> int:
        return self.settings.client_type if self.settings is not None else pb.CLIENT_TYPE_UNSPECIFIED

    @property
    def topics(self) -> set[str]:
        if self.settings is None or not self.settings.HasField("publishing"):
            return set()
        return {topic.name for topic in self.settings.publishing.topics}

    @property
    def group(self) -> str:
        if self.settings is None or not self.settings.HasField("subscription"):
            return ""
        return self.settings.subscription.group.name


class ClientRegistry:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.sessions: dict[str, ClientSession] = {}
        # Set when the node stops: Telemetry streams end, and new ones at once.
        self.closed = False
        # Ends of the Telemetry relays (broker/telemetry_relay.py) running here.
        self.relays: set[Callable[[], None]] = set()
        self.subscription_settings: SubscriptionSettings | None = None

    def touch(self, client_id: str) -> None:
        session = self.sessions.get(client_id)
        if session is not None:
            session.last_seen = time.monotonic()

    def producers_of(self, topic: str) -> list[ClientSession]:
        return [s for s in self.sessions.values() if s.client_type == pb.PRODUCER and topic in s.topics]

    def push(self, session: ClientSession, command: spb.TelemetryCommand) -> None:
        session.outbox.put_nowait(command)

    def close(self, client_id: str) -> None:
        session = self.sessions.pop(client_id, None)
        if session is not None:
            session.outbox.put_nowait(None)

    def close_all(self) -> None:
        """End every Telemetry session and relay (a stopping node's), and any
        opened later at once: their clients attach again where they are sent next."""
        self.closed = True
        for session in list(self.sessions.values()):
            session.outbox.put_nowait(None)
        for end in list(self.relays):
            end()

    # -------------------------------------------------------------- telemetry
    async def telemetry(self, client_id: str, commands: AsyncIterator[spb.TelemetryCommand],
                        until: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[spb.TelemetryCommand]:
        """Serve one client's Telemetry stream until it closes (or `until` resolves)."""
        if self.closed:
            return
        session = ClientSession(client_id)
        previous = self.sessions.get(client_id)
        if previous is not None:
            previous.outbox.put_nowait(None)  # a reconnect replaces the old stream
        self.sessions[client_id] = session
        reader = asyncio.ensure_future(self._read(session, commands))
        watcher = asyncio.ensure_future(until()) if until is not None else None
        if watcher is not None:
            watcher.add_done_callback(lambda _: session.outbox.put_nowait(None))
        try:
            while True:
                command = await session.outbox.get()
                if command is None:
                    return
                yield command
        finally:
            reader.cancel()
            if watcher is not None:
                watcher.cancel()
            if self.sessions.get(client_id) is session:
                del self.sessions[client_id]

    async def _read(self, session: ClientSession, commands: AsyncIterator[spb.TelemetryCommand]) -> None:
        try:
            async for command in commands:
                session.last_seen = time.monotonic()
                if command.HasField("settings"):
                    session.settings = command.settings
                    session.outbox.put_nowait(spb.TelemetryCommand(status=ok(), settings=self.settings_for(command.settings)))
                elif command.HasField("status") and command.status.code != pb.OK:
                    log.info("client %s reports %s: %s", session.client_id,
                             pb.Code.Name(command.status.code), command.status.message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a broken stream ends the session, whatever broke it
            log.debug("telemetry of %s ended: %s", session.client_id, error)
        finally:
            session.outbox.put_nowait(None)

    def settings_for(self, client: pb.Settings) -> pb.Settings:
        """The broker's answer to a client's settings: theirs, with what the
        broker decides filled in."""
        settings = pb.Settings()
        settings.CopyFrom(client)
        if client.HasField("publishing"):
            settings.publishing.max_body_size = self.config.max_body_size
            settings.publishing.validate_message_type = True
            settings.backoff_policy.CopyFrom(PRODUCER_BACKOFF)
        elif client.HasField("subscription") and self.subscription_settings is not None:
            settings = self.subscription_settings(settings)
        settings.metric.on = False
        return settings
