"""ReadPacer: replays yield to the node's own work.

A replay (Spark's live reader, raw runs over HTTP or gRPC) can read a node's
log as fast as the reader decodes it, and a reader on the nodes' machines
then takes the cores that appends, pushes and heartbeats need: on two shared
cores, unpaced replays cut the log's appends to about half their rate
(docs/spark.md). CockroachDB's admission control answers the same conflict by
letting background work wait while foreground work waits for the CPU; the
pacer does that for raw reads, with how long the node's loop thread waits
for a core (dledger/cpu_contention.py) as the measure.

A multiplicative rate, shared by every raw read of the node, set every
ADJUST_EVERY_S from `verdict()` (`should_yield`): YIELD (the node's writes
are held up), the allowed rate halves (from what was read in the last
period, when unpaced), never below `floor_bytes_per_s`, so a replay always
progresses; GROW, it grows by half, and above `CEILING` reads go unpaced
again; HOLD, it stays (the band between, so the rate settles rather than
swings); UNPACED (no writes), reads go unpaced at once. A node whose loop
never waits, or that takes no writes, serves replays at full speed.
Each run's bytes wait their turn in a token bucket: `delay(n)` says how long
before n more bytes may go. Thread-safe: the HTTP server's threads and the
event loop (the gRPC Read) both ask.
"""
from __future__ import annotations

import enum
import threading
import time
from typing import Callable

from dledger.cpu_contention import CpuContention

ADJUST_EVERY_S = 0.1
# No run waits longer than this: readers give a replica 2 s for its next run
# before they read elsewhere (spark/jvm LiveRuns, spark/raw_http.py), and
# many readers of one node at a low rate would otherwise queue past it. With
# that many readers the node serves more than the rate, never a timeout.
MAX_WAIT_S = 1.0
CEILING = 1 << 30          # bytes/s: above this, unpaced again
GROWTH = 1.5


class Verdict(enum.Enum):
    YIELD = "yield"        # the node's work is held up: halve the rate
    HOLD = "hold"          # the band between: keep it
    GROW = "grow"          # writes go on unhindered: grow it back
    UNPACED = "unpaced"    # no writes: nothing to yield to


def should_yield(writing: bool, contention: CpuContention, share_limit: float, min_wait: float) -> Verdict:
    """YIELD while the node takes entries (`writing`) and its loop thread
    waits for a core past `share_limit` of its runnable time, and for more
    than `min_wait` of every second; GROW well below either, HOLD in the band
    between. Without writes there is nothing to yield to: a replay alone, even
    one that keeps the loop busy itself (the gRPC Read), goes at full speed."""
    if not writing:
        return Verdict.UNPACED
    share, wait = contention.wait_share, contention.wait_rate
    if share > share_limit and wait > min_wait:
        return Verdict.YIELD
    if share < share_limit * 0.8 or wait < min_wait * 0.6:
        return Verdict.GROW
    return Verdict.HOLD


class ReadPacer:
    def __init__(self, verdict: Callable[[], Verdict], floor_bytes_per_s: int, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._verdict = verdict
        self.enabled = enabled
        self.floor = max(1, floor_bytes_per_s)
        self._clock = clock
        self._lock = threading.Lock()
        self.rate: float | None = None   # bytes/s allowed now; None: unpaced
        self._free_at = 0.0              # when the bytes already granted have gone, at `rate`
        self._window_start = clock()
        self._window_bytes = 0

    def delay(self, nbytes: int) -> float:
        """Seconds to wait before sending `nbytes` more (0.0: now)."""
        if not self.enabled:
            return 0.0
        with self._lock:
            now = self._clock()
            if now - self._window_start >= ADJUST_EVERY_S:
                self._adjust(now)
            self._window_bytes += nbytes
            if self.rate is None:
                return 0.0
            start = min(max(now, self._free_at), now + MAX_WAIT_S)
            self._free_at = start + nbytes / self.rate
            return start - now

    def _adjust(self, now: float) -> None:
        read_rate = self._window_bytes / (now - self._window_start)
        self._window_start, self._window_bytes = now, 0
        verdict = self._verdict()
        if verdict is Verdict.YIELD:
            base = self.rate if self.rate is not None else read_rate
            self.rate = max(float(self.floor), base / 2)
        elif verdict is Verdict.UNPACED:
            self.rate, self._free_at = None, 0.0
        elif verdict is Verdict.GROW and self.rate is not None:
            self.rate *= GROWTH
            if self.rate > CEILING:
                self.rate, self._free_at = None, 0.0

    @property
    def rate_bytes_per_s(self) -> float:
        """The rate allowed now (0: unpaced)."""
        return self.rate or 0.0
