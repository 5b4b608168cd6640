"""Work over a million-item list in a worker thread without starving the
event loop.

A worker thread and the event loop share the GIL. One C call over a million
items (a sort, a map, a list of a dict's keys) holds it from start to end,
and the loop cannot run meanwhile; Python code between such calls gives it
up every switch interval (5 ms), but on a machine whose two cores are busy
the loop, once it has the GIL back, may still wait for a CPU, and a busy
loop (a leader serving writes) gets a small share of the GIL. So the work
goes by slices of SLICE items (a C call each, 1-3 ms here), and between two
slices a worker thread sleeps for PAUSE_S (`breathe`): the loop takes the
GIL and the CPU the worker left without a contest. Measured with
bench.snapshot_state's writes_held scenario (a million leases, one writer
committing offsets back to back, load 2.4-4.3, four runs each): the loop's
longest gap during the snapshot 60-101 ms without the sleep, 30-97 ms
(median 44) with it, 3-4 times as many writes done meanwhile, the snapshot
0.1-0.3 s longer. With an idle loop the sleep makes no clear difference
(18-30 ms without, 20-62 ms with). On the event loop's own thread (a tool,
a test, a small state encoded in place) nothing sleeps.
"""
from __future__ import annotations

import asyncio
import heapq
import time
from typing import Any, Callable

SLICE = 16_384
# Between two slices in a worker thread. A million items take about 60
# slices per step and a snapshot of a million leases ten steps or so: 0.3 s
# more of wall time in the worker, for a loop that runs every few ms.
PAUSE_S = 0.0005


def breathe() -> None:
    """Let the event loop run, if this is a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        time.sleep(PAUSE_S)


def map_in_slices(function: Callable[[Any], Any], values: list[Any]) -> list[Any]:
    """[function(v) for v in values], by C calls over slices: half the CPU
    of the comprehension for a million values, each call short."""
    mapped: list[Any] = []
    for start in range(0, len(values), SLICE):
        mapped.extend(map(function, values[start:start + SLICE]))
        breathe()
    return mapped


def sorted_in_slices(keys: list[Any]) -> list[Any]:
    """`sorted(keys)` without one long C call (a million took 30-45 ms):
    each slice sorted on its own, then concatenated when they follow one
    another (offsets granted in rising order mostly do), else merged in
    Python (slower, but it lets the loop run)."""
    runs = []
    for start in range(0, len(keys), SLICE):
        runs.append(sorted(keys[start:start + SLICE]))
        breathe()
    if all(before[-1] < after[0] for before, after in zip(runs, runs[1:])):
        ordered: list[Any] = []
        for run in runs:
            ordered.extend(run)
        return ordered
    return list(heapq.merge(*runs))
