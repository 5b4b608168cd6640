"""The revive tick's work is bounded, whatever the backlog of expired leases:
it used to pop every expired lease off the deadline heap at its first tick
and walk all of those with attempts left at every tick after (200,000
expired leases: 407 ms on the loop, then 12-15 ms every 0.2 s)."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from broker.consumer.committer import ClaimTable
from broker.consumer.config import ConsumerConfig
from broker.consumer.pop_state import Lease, PopStateManager
from broker.consumer.revive import ReviveService

G, T = "group", "topic"
NOW = 1_000_000


def backlog(tmp_path, leases: int, attempt: int = 1) -> PopStateManager:
    state = PopStateManager(str(tmp_path))
    state.apply(1, 100, {"ops": [{"op": "reset", "group": G, "topic": T, "queue": 0, "offset": 0}]})
    state.queue(G, T, 0).restore({offset: Lease(10, NOW - 1 - offset % 1000, attempt) for offset in range(leases)})
    state.queue(G, T, 0).pop_offset = leases
    return state


def reviver(state: PopStateManager, **config: object) -> ReviveService:
    store = SimpleNamespace(groups={}, min_offset=lambda topic, queue_id: 0)
    dead_letters = SimpleNamespace(forward=None)
    return ReviveService(replace(ConsumerConfig(), **config), store, state, ClaimTable(),  # type: ignore[arg-type]
                         dead_letters, clock=lambda: NOW)  # type: ignore[arg-type]


def test_a_revive_tick_looks_at_a_bounded_number_of_expired_leases(tmp_path):
    state = backlog(tmp_path, 20_000)
    revive = reviver(state, leases_per_revive=1000)
    queue = state.queue(G, T, 0)
    for tick in range(1, 4):
        before = len(queue._deadlines)
        assert asyncio.run(revive.revive_once()) == 0
        # Attempts left, nobody to deliver to: nothing to do but look at a
        # bounded slice of the backlog, once per lease over its life.
        assert before - len(queue._deadlines) <= 1000, (tick, before, len(queue._deadlines))
    assert len(queue.in_flight) == 20_000
