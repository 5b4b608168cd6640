"""LeaderWatchdog: a client's calls do not wait out a leader that stopped.

A paused or cut-off leader answers nothing, and the connection to it stays
open: a call to it would wait for its whole timeout (seconds) before the
client looks for the new leader. So while a call to the leader has gone
unanswered for a while (`leader_check_after_s` for a unary call; a long
poll waits by design, so twice that, and only then), the client asks the
other nodes who leads (DLedger Metadata, which every node answers at once).
When one of them names another leader (in a later term), every call still
waiting on the old one is given up and tried again there: exactly what a
timeout would do, only sooner, so it is as safe as the retries already are
(a send carries its message ids, a receive its attempt id, an ack its
receipt handles). A slow but healthy leader is left alone: the followers
still name it.

The decisions (`due`, `leader_elsewhere`) are plain functions; the task
only sleeps, probes and cancels.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from rpcgen import dledger_pb2

log = logging.getLogger(__name__)

Probe = Callable[[str], Awaitable[object]]


@dataclass
class Waiting:
    """One attempt waiting on `address`."""
    address: str
    started: float
    long_poll: bool
    task: asyncio.Task[object] | None
    given_up: bool = False


def due(waiting: Iterable[Waiting], address: str, now: float, after_s: float) -> bool:
    """Whether a call to `address` has waited long enough to ask whether the
    leader moved: `after_s` for a unary call, twice that for a long poll."""
    return any(w.address == address and now - w.started >= (2 * after_s if w.long_poll else after_s)
               for w in waiting)


def leader_elsewhere(answers: Iterable[tuple[str, object]], old: str, old_term: int) -> tuple[str, int] | None:
    """(address, term) of a leader other than `old` that a node vouches for
    in a later term than `old_term`: the node itself leads, or follows it."""
    best: tuple[str, int] | None = None
    for address, answer in answers:
        if not isinstance(answer, dledger_pb2.MetadataResponse) or answer.term <= old_term:
            continue
        if answer.role == "LEADER":
            leader = address
        elif answer.leader_address:
            leader = answer.leader_address
        else:
            continue
        if leader != old and (best is None or answer.term > best[1]):
            best = (leader, answer.term)
    return best


class LeaderWatchdog:
    def __init__(self, probe: Probe, servers: Callable[[], list[str]], after_s: float) -> None:
        self.probe = probe
        self.servers = servers
        self.after_s = after_s
        self._waiting: dict[int, Waiting] = {}
        self._keys = itertools.count()
        self._task: asyncio.Task[None] | None = None
        # Set by the connection: the leader it talks to and its term.
        self.leader: str | None = None
        self.term = -1
        self.on_moved: Callable[[str, int], None] = lambda address, term: None
        self.moves = 0

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def watch(self, address: str, long_poll: bool) -> "_Watch":
        return _Watch(self, address, long_poll)

    def _add(self, waiting: Waiting) -> int:
        key = next(self._keys)
        self._waiting[key] = waiting
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return key

    def _remove(self, key: int) -> None:
        self._waiting.pop(key, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.after_s / 2)
            leader = self.leader
            if leader is None or not due(self._waiting.values(), leader, time.monotonic(), self.after_s):
                continue
            others = [a for a in self.servers() if a != leader]
            answers = await asyncio.gather(*(self.probe(a) for a in others))
            moved = leader_elsewhere(zip(others, answers), leader, self.term)
            if moved is None or self.leader != leader:
                continue
            self.moves += 1
            log.info("leader moved from %s to %s (term %d): calls waiting on the old one are tried again",
                     leader, moved[0], moved[1])
            self.on_moved(*moved)
            for waiting in list(self._waiting.values()):
                if waiting.address == leader and waiting.task is not None and not waiting.given_up:
                    waiting.given_up = True
                    waiting.task.cancel()


class _Watch:
    """Within the block, the current task is cancelled if the leader moves
    away from `address`; `given_up` then says so (and the cancellation is
    the watchdog's, not the caller's)."""

    def __init__(self, watchdog: LeaderWatchdog, address: str, long_poll: bool) -> None:
        self.watchdog = watchdog
        self.waiting = Waiting(address, time.monotonic(), long_poll, asyncio.current_task())
        self._key = -1

    def __enter__(self) -> "_Watch":
        if self.watchdog.enabled:
            self._key = self.watchdog._add(self.waiting)
        return self

    def __exit__(self, *exc: object) -> None:
        self.watchdog._remove(self._key)

    @property
    def given_up(self) -> bool:
        return self.waiting.given_up
