"""How long the event loop was stalled: the node's heartbeat health.

Everything a node does for Raft (heartbeats, votes, pushes) runs on one
event loop, so a callback that holds it for longer than the election timeout
costs a leader its leadership. The monitor sleeps a short tick and measures
how late it wakes: the lateness is the longest stall in that tick. It keeps
the longest per second for the last `window_s` seconds (the
`dledger_event_loop_lag_seconds` gauge reads their maximum) and counts
stalls above `stall_s`. A stall above `warn_s` is logged as a warning (as
etcd warns of a heartbeat sent late): it is what a spurious election on a
busy machine looks like from inside the node that caused it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

log = logging.getLogger(__name__)

TICK_S = 0.05


class LoopLagMonitor:
    def __init__(self, window_s: int = 10, stall_s: float = 0.05, warn_s: float = 0.25) -> None:
        self.window_s = window_s
        self.stall_s = stall_s
        self.warn_s = warn_s
        self.stalls = 0                                     # ticks later than stall_s
        self._seconds: deque[tuple[int, float]] = deque()   # (whole second, longest lag in it)

    @property
    def lag_s(self) -> float:
        """The longest stall in the last window_s seconds."""
        # The current (partial) second and the window_s whole seconds before
        # it: with only the seconds after the horizon, a stall near the end
        # of one second was forgotten a moment later, at the next second.
        horizon = int(time.monotonic()) - self.window_s
        return max((lag for second, lag in self._seconds if second >= horizon), default=0.0)

    def note(self, lag: float, now: float, busy: float = 0.0) -> None:
        """One tick's lateness; `busy` is the CPU time the loop's own thread
        spent in it (a stall with little of it was the process waiting for a
        core or for the GIL, not one long callback)."""
        second = int(now)
        if self._seconds and self._seconds[-1][0] == second:
            if lag > self._seconds[-1][1]:
                self._seconds[-1] = (second, lag)
        else:
            self._seconds.append((second, lag))
            while self._seconds and self._seconds[0][0] < second - self.window_s:
                self._seconds.popleft()
        if lag > self.stall_s:
            self.stalls += 1
            log.log(logging.WARNING if lag > self.warn_s else logging.DEBUG,
                    "event loop stalled for %.0f ms (%.0f ms of it on the loop thread's CPU)",
                    lag * 1000, busy * 1000)

    async def run(self) -> None:
        while True:
            before, cpu_before = time.monotonic(), time.thread_time()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self.note(max(0.0, now - before - TICK_S), now, time.thread_time() - cpu_before)
