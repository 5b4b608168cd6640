"""Long-lived tasks that die are reported, so the node can fail-stop."""
from __future__ import annotations

import asyncio

from dledger.tasks import set_crash_handler, start_task


async def test_a_task_that_dies_is_reported_with_its_name_and_error():
    reported: list[tuple[str, str]] = []
    set_crash_handler(lambda name, error: reported.append((name, str(error))))
    try:
        async def broken() -> None:
            await asyncio.sleep(0)
            raise RuntimeError("lost the plot")

        async def fine() -> None:
            await asyncio.sleep(3600)

        healthy = start_task(fine(), "Healthy")
        dying = start_task(broken(), "Elector")
        await asyncio.sleep(0.01)
        healthy.cancel()                       # a cancelled task is a normal stop
        await asyncio.gather(healthy, dying, return_exceptions=True)
        assert reported == [("Elector", "lost the plot")]
    finally:
        set_crash_handler(None)
