"""Long-lived tasks that must not die quietly.

A node is a handful of loops (the election, one dispatcher per peer, the
quorum checker, the apply loop, ...). If one of them ends with an exception
the node keeps answering RPCs while, say, never sending a heartbeat again.
That is worse than a crash: the node must fail-stop (log why, exit non-zero,
let the operator or the container's restart policy start it again, when it
recovers from its files). So every long-lived task starts here: its
unexpected end is logged once with the traceback and reported to the
process's crash handler, which the node process sets to stop itself.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Coroutine

log = logging.getLogger(__name__)

CrashHandler = Callable[[str, BaseException], None]
_crash_handler: CrashHandler | None = None


def set_crash_handler(handler: CrashHandler | None) -> None:
    global _crash_handler
    _crash_handler = handler


def start_task(coroutine: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
    """Start a long-lived task whose end by an exception stops the node."""
    task = asyncio.get_running_loop().create_task(coroutine, name=name)
    task.add_done_callback(_check_ending)
    return task


def _check_ending(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is None:
        return
    log.critical("task %s died: %s: %s", task.get_name(), type(error).__name__, error, exc_info=error)
    if _crash_handler is not None:
        _crash_handler(task.get_name(), error)


def fail_stop(what: str, error: BaseException) -> None:
    """Stop the node for a reason found outside a task (a failed fsync in a
    request handler, already logged there): the same path as a task that
    died, without a traceback."""
    if _crash_handler is not None:
        _crash_handler(what, error)
