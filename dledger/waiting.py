"""Waiting for an event with a timeout, inside long-lived task loops.

Python 3.11's asyncio.wait_for can swallow a cancellation that arrives just as
the awaited event fires (fixed in 3.12): a `while True` loop around it then
never ends and shutdown waits for it forever. asyncio.timeout does not lose
the cancellation, so every task loop waits through this helper.
"""
from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until `event` is set or `timeout` seconds pass; True if it is set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
