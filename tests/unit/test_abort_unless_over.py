"""abort_unless_over (broker/service.py): ending a stream whose caller is gone.

A relayed Telemetry stream ends with UNAVAILABLE when its leader steps down.
If the relay had already cancelled it (or its connection closed), the request
stream simply ends and grpcio fails context.abort() itself with its private
ExecuteBatchError, which the handler then logged as an "unexpected error"
(chaos seed 9001). Real gRPC server and client on loopback.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from broker.service import abort_unless_over

pytestmark = pytest.mark.timeout(30)

Abort = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


async def _end_after_the_caller_left(abort: Abort, caller_leaves: str) -> str:
    """What ending the stream raised in the handler once the caller left."""
    outcome = asyncio.get_running_loop().create_future()

    async def handler(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _ in requests:
            pass
        try:
            await abort(context)
            outcome.set_result("returned")
        except grpc.aio.AbortError:
            outcome.set_result("AbortError")
            raise
        except Exception as error:  # noqa: BLE001 - what the test looks at
            outcome.set_result(type(error).__name__)
            raise
        yield b""  # a stream handler

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Relay", {"Telemetry": grpc.stream_stream_rpc_method_handler(handler)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = channel.stream_stream("/test.Relay/Telemetry")()
        await call.write(b"settings")
        await asyncio.sleep(0.1)
        if caller_leaves == "cancels":
            call.cancel()
        else:
            await channel.close()
        return await asyncio.wait_for(outcome, 5)
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.parametrize("caller_leaves", ["cancels", "closes its connection"])
async def test_a_stream_whose_caller_is_gone_ends_quietly(caller_leaves):
    async def plain(context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "this node stopped leading")

    async def guarded(context: grpc.aio.ServicerContext) -> None:
        await abort_unless_over(context, grpc.StatusCode.UNAVAILABLE, "this node stopped leading")

    # What the handler met before: grpcio's own error, not an abort.
    assert await _end_after_the_caller_left(plain, caller_leaves) not in ("AbortError", "returned")
    assert await _end_after_the_caller_left(guarded, caller_leaves) == "returned"


async def test_a_stream_whose_caller_still_listens_is_aborted_with_the_status():
    seen = asyncio.get_running_loop().create_future()

    async def handler(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _ in requests:
            break
        await abort_unless_over(context, grpc.StatusCode.UNAVAILABLE, "this node stopped leading")
        yield b""

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Relay", {"Telemetry": grpc.stream_stream_rpc_method_handler(handler)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/test.Relay/Telemetry")()
            await call.write(b"settings")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for _ in call:
                    pass
            seen.set_result((raised.value.code(), raised.value.details()))
        assert seen.result() == (grpc.StatusCode.UNAVAILABLE, "this node stopped leading")
    finally:
        await server.stop(0)
