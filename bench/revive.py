"""The revive tick's time on the event loop with a backlog of expired leases
that still have attempts left and no consumer to take them (nothing to move
to a dead-letter queue): the pop state of one queue, no cluster. Prints one
JSON line: the first tick, the slowest and the median of the ticks after,
and the consumed-offset commit's scan.

    python -m bench.revive [--leases 1000000] [--ticks 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from types import SimpleNamespace

from broker.consumer.committer import ClaimTable
from broker.consumer.config import ConsumerConfig
from broker.consumer.pop_state import PopStateManager
from broker.consumer.revive import ReviveService

NOW = 1_700_000_000_000


def backlog(directory: str, leases: int) -> PopStateManager:
    state = PopStateManager(directory)
    state.apply(1, 100, {"ops": [{"op": "reset", "group": "G", "topic": "T", "queue": 0, "offset": 0}]})
    queue = state.queue("G", "T", 0)
    assert queue is not None
    queue.restore({offset: (10, NOW - 60_000 + offset % 50_000, 1, None) for offset in range(leases)})
    queue.pop_offset = leases
    return state


async def ticks(revive: ReviveService, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await revive.revive_once()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=1_000_000)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        state = backlog(directory, args.leases)
        store = SimpleNamespace(groups={}, min_offset=lambda topic, queue_id: 0)
        revive = ReviveService(ConsumerConfig(), store, state, ClaimTable(), None,  # type: ignore[arg-type]
                               clock=lambda: NOW)
        times = asyncio.run(ticks(revive, args.ticks))
        queue = state.queue("G", "T", 0)
        assert queue is not None
        started = time.perf_counter()
        queue.consumed_offset()
        consumed_ms = (time.perf_counter() - started) * 1000
    limit = getattr(ConsumerConfig(), "leases_per_revive", None)
    print(json.dumps({"bench": "revive_tick", "expired_leases": args.leases, "leases_per_revive": limit,
                      "first_tick_ms": round(times[0], 1), "max_later_tick_ms": round(max(times[1:]), 1),
                      "median_later_tick_ms": round(statistics.median(times[1:]), 1),
                      "consumed_offset_scan_ms": round(consumed_ms, 1)}), flush=True)


if __name__ == "__main__":
    main()
