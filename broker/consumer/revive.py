"""ReviveService: the leader's timer work on the pop state (RocketMQ's
PopReviveService, less the copying into retry topics: an expired lease is
redelivered in place, see README "Consuming").

Every `revive_interval_s` on the leader:
- a lease that expired after the group's last attempt moves its message to
  `%DLQ%<group>` (dead_letter.py); so does one whose message retention has
  removed (nothing to copy then);
- every `offset_commit_interval_s`, consumed offsets that moved are written to
  the consumer offset table through the log (one entry for all), so consumer
  lag is visible and pull consumers and tools see pop progress.

Deadlines are in the replicated state, so a new leader's first tick picks up
what the old one left. Redeliveries themselves need no timer: an expired lease
is simply deliverable to the next receive, and waiting receives time out at
the next deadline (long_polling.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from broker.consumer.committer import ClaimTable
from broker.consumer.config import ConsumerConfig
from broker.consumer.dead_letter import DeadLetter, DeadLetterService
from broker.consumer.pop_state import ATTEMPT, LEASE_ID, PopStateManager
from broker.consumer.receive import WallClock, max_attempts, wall_clock_ms
from broker.consumer.source import StoreQueueSource
from broker.errors import BrokerError
from dledger.errors import DLedgerError
from store.errors import StoreError
from store.message_store import MessageStore
from store.subscription_group import SubscriptionGroupConfig

log = logging.getLogger(__name__)
FAILURE_LOG_INTERVAL_S = 10.0


class ReviveService:
    def __init__(self, config: ConsumerConfig, store: MessageStore, state: PopStateManager, claims: ClaimTable,
                 dead_letters: DeadLetterService, clock: WallClock = wall_clock_ms) -> None:
        self.config = config
        self.store = store
        self.state = state
        self.claims = claims
        self.dead_letters = dead_letters
        self.clock = clock
        self._last_commit = 0.0
        self._last_failure_log = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.revive_interval_s)
            ready_from = self.store.server.leader_ready_from()
            if ready_from is None or self.store.applied_index < ready_from:
                continue  # only a leader that has applied its predecessors' work revives
            try:
                await self.revive_once()
                if time.monotonic() - self._last_commit >= self.config.offset_commit_interval_s:
                    await self.commit_offsets()
                    self._last_commit = time.monotonic()
            except (StoreError, DLedgerError, BrokerError) as error:
                # Leadership moved or the log is unavailable: the next leader's
                # (or the next tick's) revive does it.
                if time.monotonic() - self._last_failure_log >= FAILURE_LOG_INTERVAL_S:
                    self._last_failure_log = time.monotonic()
                    log.info("revive deferred: %s", error)

    async def revive_once(self) -> int:
        """Dead-letter what is due; returns how many leases it ended. The
        work is bounded: at most `leases_per_revive` expired leases are
        looked at for the first time (each lease once), and only those out
        of attempts are walked, at most `dead_letters_per_revive` moved."""
        now = self.clock()
        due: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
        room = self.config.dead_letters_per_revive
        budget = self.config.leases_per_revive
        for (group, topic, queue_id), queue in self.state:
            if room <= 0:
                break
            attempts = max_attempts(self.store.groups.get(group) or SubscriptionGroupConfig(group))
            first_retained = self.store.min_offset(topic, queue_id)
            budget -= queue.find_expired(now, attempts, first_retained, max(budget, 0))
            exhausted = queue.exhausted(now, attempts, first_retained, limit=0)
            if not exhausted:
                continue
            claims = self.claims.get((group, topic, queue_id))
            source = StoreQueueSource(self.store, topic, queue_id)
            for offset, lease in exhausted.items():
                if room <= 0:
                    break
                if claims is not None and offset in claims.offsets:
                    continue
                message = source.read(offset) if offset >= first_retained else None
                due[(group, topic)].append(DeadLetter(queue_id, offset, lease[LEASE_ID], lease[ATTEMPT], message))
                room -= 1
        moved = 0
        for (group, topic), letters in due.items():
            moved += len(await self.dead_letters.forward(group, topic, letters,
                                                         f"no ack after {letters[0].attempt} attempt(s)", now))
        return moved

    async def commit_offsets(self) -> int:
        """Write consumed offsets that moved; returns how many."""
        commits = []
        for (group, topic, queue_id), queue in self.state:
            consumed = queue.consumed_offset()
            if self.store.offsets.query(group, topic, queue_id) != consumed:
                commits.append((group, topic, queue_id, consumed))
        if commits:
            await self.store.commit_offsets(commits)
        return len(commits)
