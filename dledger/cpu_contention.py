"""CpuContention: how long the event loop's thread waits for a core.

A node's own work (appends, pushes, heartbeats) all runs on its event loop's
thread. When something else on the machine keeps the cores busy (a replay
decoding the log beside the nodes, say), that thread spends time runnable
but not running: Linux counts it per thread (schedstat's run-queue wait, the
run_delay of sched_info). The share of the thread's runnable time spent
waiting says how much the node's own work is held up now; the wait per
second of wall time says whether there is enough of it to matter (a thread
that runs 2 ms a second and waits 2 ms is not held up by anything).

Sampled every TICK_S on the loop thread itself and smoothed over a few ticks.
Where Linux keeps no schedstat, `available` is False and the readings stay 0.
"""
from __future__ import annotations

import asyncio
import time

TICK_S = 0.1
WEIGHT = 0.5   # of the newest tick in the smoothed readings: about the last 0.2-0.3 s
SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_schedstat() -> tuple[int, int] | None:
    """(ns on a core, ns runnable and waiting for one) of the calling thread."""
    try:
        with open(SCHEDSTAT, "rb") as file:
            on_cpu, waiting, _ = file.read().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


class CpuContention:
    def __init__(self) -> None:
        self.available = thread_schedstat() is not None
        self.run_rate = 0.0    # the loop thread's CPU, seconds per second
        self.wait_rate = 0.0   # its wait for a core, seconds per second

    @property
    def wait_share(self) -> float:
        """Of the thread's runnable time, the part spent waiting for a core."""
        runnable = self.run_rate + self.wait_rate
        return self.wait_rate / runnable if runnable > 0 else 0.0

    def note(self, ran_s: float, waited_s: float, wall_s: float) -> None:
        if wall_s <= 0:
            return
        self.run_rate += WEIGHT * (ran_s / wall_s - self.run_rate)
        self.wait_rate += WEIGHT * (waited_s / wall_s - self.wait_rate)

    async def run(self) -> None:
        """Sample the calling (loop) thread until cancelled."""
        if not self.available:
            return
        before, at = thread_schedstat(), time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now, sample = time.monotonic(), thread_schedstat()
            if sample is None or before is None:
                before, at = sample, now
                continue
            self.note((sample[0] - before[0]) / 1e9, (sample[1] - before[1]) / 1e9, now - at)
            before, at = sample, now
