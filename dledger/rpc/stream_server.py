"""The server's end of a bidirectional stream of requests, each answered on
its own (PeerStream, AppendStream): every request is answered in its own
task, so a slow one (an APPEND waiting for its fsync, an append waiting for
its commit) holds up nothing behind it; tasks start in arrival order, so the
synchronous start of each runs in order. When the stream ends the tasks
still running are cancelled, as gRPC cancels a unary handler whose call ended.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

import grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def serve_each(context: grpc.aio.ServicerContext, answer: Callable[[Req], Awaitable[Resp | None]]) -> None:
    """Read requests until the client half-closes, answer each with
    `answer(request)` (None: no answer, the stream is being aborted), then
    wait for the answers still coming."""
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
                request = await context.read()
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
