"""Long polling: receives and pulls that found nothing wait for a reason to
look again, never on a timer loop (RocketMQ's PopLongPollingService and
PullRequestHoldService).

A waiter registers for a topic *before* it looks, so nothing that happens
between the look and the wait is missed. It is woken when the apply loop
applies a message of the topic (the store's arrival listener), or when the
pop state ends or moves a lease of the topic (an ack frees a FIFO message
group, a ChangeInvisibleDuration to zero makes a message deliverable now).
Expiring leases need no wake-up: the waiter's own timeout ends at the next
lease deadline.
"""
from __future__ import annotations

import asyncio

from store.codec import DispatchRequest


class Waiter:
    def __init__(self, service: LongPollingService, topic: str) -> None:
        self._service = service
        self.topic = topic
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait(self, timeout: float) -> bool:
        """Wait until woken or `timeout` seconds pass; True when woken."""
        if timeout <= 0 or self.future.done():
            return self.future.done()
        try:
            await asyncio.wait_for(asyncio.shield(self.future), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def close(self) -> None:
        self._service.unregister(self)
        if not self.future.done():
            self.future.cancel()


class LongPollingService:
    def __init__(self) -> None:
        self._waiters: dict[str, set[Waiter]] = {}
        self.wakeups = 0

    def register(self, topic: str) -> Waiter:
        waiter = Waiter(self, topic)
        self._waiters.setdefault(topic, set()).add(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter.topic)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter.topic]

    def notify(self, topic: str) -> None:
        waiters = self._waiters.pop(topic, None)
        if not waiters:
            return
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)
                self.wakeups += 1

    # The store calls this for every applied message: a dict lookup when nobody waits.
    def on_arrival(self, request: DispatchRequest, index: int) -> None:
        if self._waiters:
            self.notify(request.topic)

    def on_release(self, group: str, topic: str) -> None:
        if self._waiters:
            self.notify(topic)

    def wake_all(self) -> None:
        """Leadership moved: every waiter looks again (and learns it)."""
        for topic in list(self._waiters):
            self.notify(topic)
