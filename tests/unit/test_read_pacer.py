"""ReadPacer (replays yield to the node's own work) with a hand-driven clock
and verdict, and CpuContention against real processes keeping the cores busy."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import time

import pytest

from dledger.cpu_contention import CpuContention
from dledger.read_pacer import ADJUST_EVERY_S, CEILING, MAX_WAIT_S, ReadPacer, Verdict, should_yield

MIB = 1 << 20
STEP = ADJUST_EVERY_S * 1.01   # just past one adjustment period


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


Y, H, G, U = Verdict.YIELD, Verdict.HOLD, Verdict.GROW, Verdict.UNPACED


def pacer_with(verdicts: list[Verdict], floor: int = MIB, enabled: bool = True) -> tuple[ReadPacer, Clock]:
    clock = Clock()
    pending = list(verdicts)
    return ReadPacer(lambda: pending.pop(0) if pending else H, floor, enabled=enabled, clock=clock), clock


def test_a_node_that_never_waits_serves_replays_unpaced():
    pacer, clock = pacer_with([G] * 50)
    for _ in range(200):
        assert pacer.delay(MIB) == 0.0
        clock.now += 0.01
    assert pacer.rate is None and pacer.rate_bytes_per_s == 0.0


def test_contention_halves_what_was_read_and_the_runs_then_wait_their_turn():
    pacer, clock = pacer_with([Y])
    for _ in range(10):                    # 10 MiB in the first period: 100 MiB/s
        assert pacer.delay(MIB) == 0.0
        clock.now += 0.01
    clock.now += 0.0001                     # the period is over: adjusted to half the rate read
    assert pacer.delay(MIB) == 0.0          # the first run goes at once
    assert pacer.rate == pytest.approx(10 * MIB / (ADJUST_EVERY_S + 0.0001) / 2)
    waits = [pacer.delay(MIB) for _ in range(3)]   # then each waits its share of the rate, back to back
    step = MIB / pacer.rate
    assert waits == pytest.approx([step, 2 * step, 3 * step])


def test_the_rate_never_falls_below_the_floor():
    pacer, clock = pacer_with([Y] * 40, floor=2 * MIB)
    for _ in range(40):
        pacer.delay(64 << 10)
        clock.now += STEP
    assert pacer.rate == 2 * MIB


def test_the_band_between_holds_the_rate_and_calm_grows_it_back_to_unpaced():
    pacer, clock = pacer_with([Y, H, H] + [G] * 60)
    pacer.delay(MIB)
    clock.now += STEP
    pacer.delay(MIB)                        # contended: paced
    paced = pacer.rate
    assert paced is not None
    for _ in range(2):                      # the band: held
        clock.now += STEP
        pacer.delay(1)
        assert pacer.rate == paced
    grown = []
    while pacer.rate is not None and len(grown) < 60:
        clock.now += STEP
        pacer.delay(1)
        grown.append(pacer.rate)
    assert pacer.rate is None, "calm never let the reads go unpaced again"
    assert all(b > a for a, b in zip(grown, grown[1:-1])) and grown[-2] <= CEILING


def test_many_readers_at_the_floor_never_wait_past_a_readers_deadline():
    """Eight readers of one node asking 1 MiB runs at once at 1 MiB/s: a strict
    bucket would keep the last one waiting 7 s, past the 2 s readers give a
    replica; no wait goes beyond MAX_WAIT_S."""
    pacer, clock = pacer_with([H] * 10)
    pacer.rate = float(MIB)   # paced down to the floor earlier; held there
    waits = [pacer.delay(MIB) for _ in range(8)]
    assert waits[:2] == pytest.approx([0.0, 1.0 if MAX_WAIT_S >= 1.0 else MAX_WAIT_S])
    assert max(waits) == pytest.approx(MAX_WAIT_S) and MAX_WAIT_S < 2.0


def test_pacing_off_never_waits():
    pacer, clock = pacer_with([Y] * 20, enabled=False)
    for _ in range(20):
        assert pacer.delay(8 * MIB) == 0.0
        clock.now += STEP


def readings(run_rate: float, wait_rate: float) -> CpuContention:
    contention = CpuContention()
    contention.run_rate, contention.wait_rate = run_rate, wait_rate
    return contention


@pytest.mark.parametrize("writing, run_rate, wait_rate, verdict", [
    (True, 0.2, 0.3, Y),      # held up: 60% of its runnable time waiting, 0.3 s a second
    (False, 0.2, 0.3, U),     # the same wait with no entries coming in: nothing to yield to
    (True, 0.4, 0.15, G),     # a busy node that waits 27%: its own load, not the replay's
    (True, 0.02, 0.04, G),    # a nearly idle loop: waits, but too little to matter
    (True, 0.3, 0.25, H),     # 45%: the band just under the share, hold
])
def test_replays_yield_only_to_writes_held_up_long_enough(writing, run_rate, wait_rate, verdict):
    assert should_yield(writing, readings(run_rate, wait_rate), 0.5, 0.08) is verdict


def test_without_writes_a_paced_replay_goes_unpaced_at_once():
    pacer, clock = pacer_with([Y, U])
    pacer.delay(MIB)
    clock.now += STEP
    pacer.delay(MIB)
    assert pacer.rate is not None
    clock.now += STEP
    assert pacer.delay(MIB) == 0.0 and pacer.rate is None


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not CpuContention().available, reason="this kernel keeps no per-thread schedstat")
def test_cpu_contention_sees_the_loop_thread_wait_while_other_processes_hold_the_cores():
    """Twice as many spinning processes as cores: a busy loop thread then waits
    for a core for much of its runnable time, and CpuContention says so."""
    async def busy_loop(contention: CpuContention, seconds: float) -> None:
        task = asyncio.create_task(contention.run())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _spin(0.02)
            await asyncio.sleep(0.001)
        task.cancel()

    spinners = [multiprocessing.Process(target=_spin, args=(2.5,)) for _ in range(2 * (os.cpu_count() or 1))]
    for process in spinners:
        process.start()
    try:
        contended = CpuContention()
        asyncio.run(busy_loop(contended, 1.5))
    finally:
        for process in spinners:
            process.join(10)
    assert contended.wait_share > 0.3, (contended.run_rate, contended.wait_rate)
    assert contended.wait_rate > 0.2
