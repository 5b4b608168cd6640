"""ConsumerService: the consumption parts of one node, assembled.

Built with the broker, before the store replays the log: the pop state
registers with the store as a replicated state machine (kind POP_OPS), long
polling listens to applied messages, and the client registry asks it for a
consumer's settings. Every node applies the pop state; only the leader
decides, writes, and runs the revive task (followers forward consumer calls).
"""
from __future__ import annotations

import asyncio
import logging

from broker.clients import ClientRegistry
from broker.consumer.ack import AckService
from broker.consumer.committer import ClaimTable, PopCommitter
from broker.consumer.config import ConsumerConfig
from broker.consumer.dead_letter import DeadLetterService
from broker.consumer.long_polling import LongPollingService
from broker.consumer.pop_state import PopStateManager
from broker.consumer.pull import PullService
from broker.consumer.receive import EnsureGroup, ReceiveService, WallClock, wall_clock_ms
from broker.consumer.revive import ReviveService
from broker.consumer.settings import subscription_settings
from broker.topics import TopicService
from store.message_store import MessageStore

log = logging.getLogger(__name__)


class ConsumerService:
    def __init__(self, store: MessageStore, topics: TopicService, clients: ClientRegistry, ensure_group: EnsureGroup,
                 config: ConsumerConfig | None = None, clock: WallClock = wall_clock_ms) -> None:
        self.config = config = config or ConsumerConfig()
        self.store = store
        self.state = PopStateManager(store.config.config_dir)
        store.add_manager(self.state)
        self.polling = LongPollingService()
        store.add_arrival_listener(self.polling.on_arrival)
        self.state.release_listeners.append(self.polling.on_release)
        self.committer = PopCommitter(store, config.max_in_flight_appends, ready_wait_s=config.ready_wait_s)
        self.claims = ClaimTable()
        self.dead_letters = DeadLetterService(store, topics, self.state, self.committer, self.claims)
        self.receiver = ReceiveService(config, store, topics, self.state, self.committer, self.claims, self.polling,
                                       ensure_group, clock)
        self.acks = AckService(store, self.state, self.committer, self.dead_letters, clock)
        self.reviver = ReviveService(config, store, self.state, self.claims, self.dead_letters, clock)
        self.puller = PullService(config, store, topics, self.state, self.committer, self.polling, ensure_group)
        clients.subscription_settings = subscription_settings(store.groups, config)
        self._revive_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._revive_task = asyncio.get_running_loop().create_task(self.reviver.run(), name="ReviveService")

    async def stop(self) -> None:
        if self._revive_task is not None:
            self._revive_task.cancel()
            await asyncio.gather(self._revive_task, return_exceptions=True)
        self.polling.wake_all()
        await self.committer.close()
