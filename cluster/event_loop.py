"""Which event loop a node process runs on: asyncio's own, or uvloop's.

A node spends much of each request in the loop's own machinery (waking
tasks, futures' callbacks, the selector, the hand-offs to the flush thread),
and uvloop does that work in C over libuv. One append at a time, where that
machinery is most of the work, measured 11% faster on 2 cores with uvloop
in eight alternated pairs, though not in two later benchmark runs, and the
batched paths did not move outside the noise (docs/running.md, "Event
loop"). grpc.aio works on either: it polls in a thread of its own and wakes
the loop through a file descriptor, which any loop can watch.

`dledger node --event-loop uvloop` (or DLEDGER_EVENT_LOOP=uvloop) chooses it.
"""
from __future__ import annotations

import asyncio
from typing import Coroutine, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("asyncio", "uvloop")
DEFAULT_EVENT_LOOP = "asyncio"


def check_event_loop(name: str, where: str) -> str:
    """`name` if it names a loop (uvloop is a base dependency); ValueError naming `where` otherwise."""
    if name not in EVENT_LOOPS:
        raise ValueError(f"{where}: {name!r} is not an event loop (asyncio or uvloop)")
    return name


def run(main: Coroutine[object, object, T], loop: str = DEFAULT_EVENT_LOOP) -> T:
    """asyncio.run(main) on the chosen loop."""
    if loop == "uvloop":
        import uvloop
        return uvloop.run(main)
    return asyncio.run(main)


def loop_name() -> str:
    """The running loop's kind, as --event-loop names it."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
