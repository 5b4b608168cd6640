"""The server's end of a bidirectional stream of requests, each answered on
its own (PeerStream, AppendStream): every request is answered in its own
task, so a slow one (an APPEND waiting for its fsync, an append waiting for
its commit) holds up nothing behind it; tasks start in arrival order, so the
synchronous start of each runs in order. When the stream ends the tasks
still running are cancelled, as gRPC cancels a unary handler whose call ended.

`OpenStreams` lets a stopping node end its long-lived streams. gRPC's
graceful stop waits for every call in flight, and a stream that nobody ends
(a leader's PeerStream on a follower, a follower's relay to the leader, a
client's AppendStream, a Telemetry session) is a call in flight until the
grace runs out: every stop of a node with peers took the whole grace (2 s),
measured, for nothing. Closed, each stream stops reading, answers what it
has read, and ends; its caller opens its next stream elsewhere.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

import grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class OpenStreams:
    """A node's long-lived streams, to be ended together when it stops."""

    def __init__(self) -> None:
        self.closing = False
        self._readers: set[asyncio.Task[object]] = set()
        self._on_close: list[Callable[[], None]] = []

    async def read(self, context: grpc.aio.ServicerContext) -> object:
        """`context.read()`, or EOF once the node is closing (also when it
        starts closing during the read): the stream then ends as if its
        caller had half-closed it. Requests not read by then were never
        started, so their callers may send them again elsewhere."""
        if self.closing:
            return grpc.aio.EOF
        task = asyncio.current_task()
        assert task is not None
        self._readers.add(task)
        try:
            return await context.read()
        except asyncio.CancelledError:
            if not self.closing:
                raise
            task.uncancel()
            return grpc.aio.EOF
        finally:
            self._readers.discard(task)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Streams that do not read through `read` (Telemetry sessions) are ended by `callback`."""
        self._on_close.append(callback)

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        # Only a task waiting in `read` is cancelled: one answering a request
        # goes on, and ends at its next read.
        for task in self._readers:
            task.cancel()
        for callback in self._on_close:
            callback()


async def serve_each(context: grpc.aio.ServicerContext, answer: Callable[[Req], Awaitable[Resp | None]],
                     streams: OpenStreams | None = None) -> None:
    """Read requests until the client half-closes (or `streams` close),
    answer each with `answer(request)` (None: no answer, the stream is being
    aborted), then wait for the answers still coming."""
    write_lock = asyncio.Lock()   # gRPC allows one write at a time on a call
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    async def answer_one(request: Req) -> None:
        try:
            response = await answer(request)
            if response is None:
                return
            async with write_lock:
                await context.write(response)
        except grpc.aio.BaseError:
            # The call ended under this answer (the caller gave the stream
            # up, and its own timeout covers the request) or was aborted:
            # gRPC's own errors say only that. Anything else is a bug and
            # stays loud.
            return

    try:
        while True:
            try:
                request = await (streams.read(context) if streams is not None else context.read())
            except grpc.aio.BaseError:
                return   # the call broke under the read: nothing more to read or to answer
            if request is grpc.aio.EOF:
                break
            task = loop.create_task(answer_one(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
