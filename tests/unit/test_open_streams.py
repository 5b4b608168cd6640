"""A stopping node ends its long-lived streams (dledger/rpc/stream_server.py
OpenStreams), against real gRPC servers on loopback ports: a stream stops
reading, answers what it read, ends with OK; a request it had not read is
never started; the server's graceful stop then returns at once instead of
after its whole grace; the relay (broker/relay.py) ends the same way, its
calls answered or failed UNAVAILABLE, never run half."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from broker.relay import RelayCallError, RelayClient, RelayedHandlers, RelayServicer
from cluster.process_cluster import free_ports
from dledger.rpc.stream_server import OpenStreams, serve_each
from rpcgen.pydledger.relay.v1 import relay_pb2_grpc
from tests.unit.test_relay import HOLD, TICKET, Echo, NeedsTicket

pytestmark = pytest.mark.timeout(30)
METHOD = "/test.Streams/Each"
# Far longer than any test here waits: a stop that waits for it fails the test.
GRACE_S = 20.0


class Answerer:
    """Answers each request (bytes) once `release` is set; records what it started."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[bytes] = []

    async def answer(self, request: bytes) -> bytes:
        self.started.append(request)
        await self.release.wait()
        return b"answer:" + request


async def serve(streams: OpenStreams, answerer: Answerer) -> tuple[grpc.aio.Server, str]:
    async def each(requests: Any, context: grpc.aio.ServicerContext) -> None:
        await serve_each(context, answerer.answer, streams)

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Streams", {"Each": grpc.stream_stream_rpc_method_handler(each)})])
    address = f"127.0.0.1:{free_ports(1)[0]}"
    assert server.add_insecure_port(address)
    await server.start()
    return server, address


async def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def timed_stop(server: grpc.aio.Server) -> float:
    started = asyncio.get_running_loop().time()
    await server.stop(GRACE_S)
    return asyncio.get_running_loop().time() - started


async def test_a_closed_stream_answers_what_it_read_ends_and_lets_the_stop_return_at_once():
    streams, answerer = OpenStreams(), Answerer()
    server, address = await serve(streams, answerer)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(METHOD)()
        await call.write(b"first")
        await wait_for(lambda: answerer.started == [b"first"])
        streams.close()
        await call.write(b"after the close")     # the server reads no more
        await asyncio.sleep(0.1)
        stopping = asyncio.ensure_future(timed_stop(server))
        await asyncio.sleep(0.1)
        answerer.release.set()                   # the answer in flight is given...
        assert await call.read() == b"answer:first"
        assert await call.read() is grpc.aio.EOF  # ...and the stream ends
        assert await call.code() == grpc.StatusCode.OK
        assert await stopping < 2.0
    assert answerer.started == [b"first"]        # what came after the close never started


async def test_an_idle_stream_ends_at_the_close_and_a_stream_opened_after_it_ends_at_once():
    streams, answerer = OpenStreams(), Answerer()
    answerer.release.set()
    server, address = await serve(streams, answerer)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            idle = channel.stream_stream(METHOD)()
            await idle.write(b"one")
            assert await idle.read() == b"answer:one"
            streams.close()
            assert await asyncio.wait_for(idle.read(), 2.0) is grpc.aio.EOF
            late = channel.stream_stream(METHOD)()
            await late.write(b"two")
            assert await asyncio.wait_for(late.read(), 2.0) is grpc.aio.EOF
            assert answerer.started == [b"one"]
    finally:
        assert await timed_stop(server) < 2.0


async def test_without_a_close_a_graceful_stop_waits_for_an_open_stream():
    """What the close is for: the same idle stream holds a stop for its grace."""
    streams, answerer = OpenStreams(), Answerer()
    answerer.release.set()
    server, address = await serve(streams, answerer)
    async with grpc.aio.insecure_channel(address) as channel:
        idle = channel.stream_stream(METHOD)()
        await idle.write(b"one")
        assert await idle.read() == b"answer:one"
        started = asyncio.get_running_loop().time()
        await server.stop(0.5)
        assert asyncio.get_running_loop().time() - started >= 0.45


async def test_a_closing_leader_answers_its_relayed_calls_and_ends_the_relay_stream():
    echo, streams = Echo(), OpenStreams()
    echo.release.clear()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    relay_pb2_grpc.add_RelayServiceServicer_to_server(
        RelayServicer(RelayedHandlers([echo.register], lambda: [NeedsTicket()]), streams), server)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    assert server.add_insecure_port(address)
    await server.start()
    async with grpc.aio.insecure_channel(address) as channel:
        client = RelayClient(channel, window=8, max_hold_s=0.0)
        try:
            held = asyncio.ensure_future(client.call(HOLD, b"in flight", TICKET, 10.0))
            await wait_for(lambda: echo.held == 1)
            streams.close()
            await asyncio.sleep(0.1)
            stopping = asyncio.ensure_future(timed_stop(server))
            late = asyncio.ensure_future(client.call(HOLD, b"too late", TICKET, 10.0))
            await asyncio.sleep(0.1)
            echo.release.set()
            assert await held == b"in flight"
            with pytest.raises(RelayCallError) as failed:
                await late
            assert failed.value.code == grpc.StatusCode.UNAVAILABLE
            assert await stopping < 2.0
            assert echo.finished == [b"in flight"] and echo.held == 1   # the late call never ran
        finally:
            await client.close()
