"""The relay of forwarded calls (broker/relay.py) against a real gRPC server on
a loopback port: each call gets its own answer with its metadata and deadline,
behind the server's interceptors; a busy relay batches calls once its window
is full, an idle one sends at once; failures come back as the status a unary
call would have ended with; a broken stream fails what waits on it and the
next call opens a new one."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from broker.method_wrapping import MethodWrappingInterceptor
from broker.relay import RelayCallError, RelayClient, RelayedHandlers, RelayServicer
from cluster.process_cluster import free_ports
from rpcgen.pydledger.relay.v1 import relay_pb2_grpc

ECHO = "/test.Echo/Say"
FAIL = "/test.Echo/Fail"
HOLD = "/test.Echo/Hold"
STREAM = "/test.Echo/Many"


class Echo:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.held = 0
        self.cancelled: list[bytes] = []
        self.finished: list[bytes] = []

    async def say(self, request: bytes, context: Any) -> bytes:
        metadata = dict(context.invocation_metadata())
        remaining = context.time_remaining()
        return b"|".join([request, metadata.get("who", "").encode(), b"deadline" if remaining else b"none"])

    async def fail(self, request: bytes, context: Any) -> bytes:
        if request == b"abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "told to abort")
        raise ValueError("a bug")

    async def hold(self, request: bytes, context: Any) -> bytes:
        self.held += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(request)
            raise
        self.finished.append(request)
        return request

    async def many(self, request: bytes, context: Any) -> Any:
        yield request

    def register(self, server: Any) -> None:
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {
            "Say": grpc.unary_unary_rpc_method_handler(self.say),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "Hold": grpc.unary_unary_rpc_method_handler(self.hold),
            "Many": grpc.unary_stream_rpc_method_handler(self.many)})])


class NeedsTicket(MethodWrappingInterceptor):
    """Refuses calls without a `ticket` header, as the auth interceptor refuses unsigned ones."""

    def wraps(self, method: str) -> bool:
        return method.startswith("/test.Echo/")

    def wrap(self, method: str, handler: Any) -> Any:
        if handler.response_streaming:
            return handler

        async def checked(request: bytes, context: Any) -> bytes:
            if "ticket" not in dict(context.invocation_metadata()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no ticket")
            return await handler.unary_unary(request, context)
        return grpc.unary_unary_rpc_method_handler(checked)


async def start(echo: Echo, port: int) -> grpc.aio.Server:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    relay_pb2_grpc.add_RelayServiceServicer_to_server(
        RelayServicer(RelayedHandlers([echo.register], lambda: [NeedsTicket()])), server)
    assert server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


TICKET = [("ticket", "1")]


@pytest.fixture
async def relay() -> Any:
    echo = Echo()
    port = free_ports(1)[0]
    server = await start(echo, port)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    client = RelayClient(channel, window=2, max_hold_s=5.0)
    yield client, echo, server, port, channel
    await client.close()
    await channel.close()
    await server.stop(0)


async def test_each_call_gets_its_own_answer_with_its_metadata_and_deadline(relay: Any) -> None:
    client, *_ = relay
    answers = await asyncio.gather(*(client.call(ECHO, f"m{i}".encode(), [*TICKET, ("who", f"c{i}")],
                                                 2.0 if i % 2 else None) for i in range(40)))
    assert answers == [f"m{i}|c{i}|{'deadline' if i % 2 else 'none'}".encode() for i in range(40)]
    # Made in one loop turn, they shared one stream message.
    assert (client.messages, client.calls) == (1, 40)


async def test_the_servers_interceptors_check_every_relayed_call(relay: Any) -> None:
    client, *_ = relay
    with pytest.raises(RelayCallError) as refused:
        await client.call(ECHO, b"x", [("who", "nobody")], 2.0)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED and refused.value.details == "no ticket"


async def test_failures_come_back_as_a_unary_call_would_end(relay: Any) -> None:
    client, *_ = relay
    with pytest.raises(RelayCallError) as aborted:
        await client.call(FAIL, b"abort", TICKET, 2.0)
    assert (aborted.value.code, aborted.value.details) == (grpc.StatusCode.FAILED_PRECONDITION, "told to abort")
    with pytest.raises(RelayCallError) as bug:
        await client.call(FAIL, b"raise", TICKET, 2.0)
    assert bug.value.code == grpc.StatusCode.UNKNOWN and "a bug" in bug.value.details
    for method in ("/test.Echo/Nothing", STREAM):
        with pytest.raises(RelayCallError) as refused:
            await client.call(method, b"", TICKET, 2.0)
        assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED, method
    assert await client.call(ECHO, b"still", TICKET, 2.0) == b"still||deadline"


async def test_a_busy_relay_batches_once_its_window_is_full_and_an_idle_one_sends_at_once(relay: Any) -> None:
    client, echo, *_ = relay
    echo.release.clear()
    first = [asyncio.ensure_future(client.call(HOLD, b"a", TICKET, 10.0))]
    await asyncio.sleep(0.05)
    first.append(asyncio.ensure_future(client.call(HOLD, b"b", TICKET, 10.0)))
    await asyncio.sleep(0.05)
    assert client.messages == 2 and echo.held == 2    # the window (2) is full now
    rest = []
    for i in range(8):                                 # each in a turn of its own
        rest.append(asyncio.ensure_future(client.call(HOLD, str(i).encode(), TICKET, 10.0)))
        await asyncio.sleep(0.01)
    assert client.messages == 2 and echo.held == 2    # held back
    echo.release.set()
    assert await asyncio.gather(*first, *rest) == [b"a", b"b", *(str(i).encode() for i in range(8))]
    assert (client.messages, client.calls) == (3, 10)  # the eight went together
    assert await client.call(ECHO, b"idle", TICKET, 2.0) == b"idle||deadline"
    assert client.messages == 4


async def test_a_held_call_goes_out_after_max_hold_even_with_the_window_full(relay: Any) -> None:
    client, echo, *_ = relay
    client.max_hold_s = 0.1
    echo.release.clear()
    held = [asyncio.ensure_future(client.call(HOLD, b"a", TICKET, 10.0))]
    await asyncio.sleep(0.02)
    held.append(asyncio.ensure_future(client.call(HOLD, b"b", TICKET, 10.0)))
    await asyncio.sleep(0.02)
    assert await asyncio.wait_for(client.call(ECHO, b"late", TICKET, 2.0), 1.0) == b"late||deadline"
    echo.release.set()
    assert await asyncio.gather(*held) == [b"a", b"b"]


async def test_a_caller_that_stops_waiting_has_its_call_cancelled_on_the_leader(relay: Any) -> None:
    """As gRPC cancels a unary call's handler: a send whose caller gave up
    (deadline, client gone, leader moved) must not store its message later."""
    client, echo, *_ = relay
    echo.release.clear()
    with pytest.raises(RelayCallError) as late:
        await client.call(HOLD, b"slow", TICKET, 0.2)
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    abandoned = client.submit(HOLD, b"abandoned", TICKET, None)   # no deadline: only the cancel stops it
    await asyncio.sleep(0.1)
    abandoned.cancel()
    await asyncio.sleep(0.2)
    echo.release.set()
    await asyncio.sleep(0.05)
    assert sorted(echo.cancelled) == [b"abandoned", b"slow"] and echo.finished == []
    assert await client.call(ECHO, b"next", TICKET, 2.0) == b"next||deadline"


async def test_the_leader_cancels_a_call_whose_deadline_passed_even_if_no_cancel_comes(relay: Any) -> None:
    client, echo, *_ = relay
    echo.release.clear()
    pending = client.submit(HOLD, b"deadline", TICKET, 0.2)   # submitted, nobody waits on it here
    await asyncio.sleep(0.5)
    assert echo.cancelled == [b"deadline"] and not pending.done()
    pending.cancel()


async def test_a_withdrawn_call_that_was_still_queued_never_reaches_the_leader(relay: Any) -> None:
    client, echo, *_ = relay
    echo.release.clear()
    first = [client.submit(HOLD, b"a", TICKET, 10.0)]
    await asyncio.sleep(0.05)
    first.append(client.submit(HOLD, b"b", TICKET, 10.0))
    await asyncio.sleep(0.05)
    queued = client.submit(HOLD, b"queued", TICKET, 10.0)      # the window is full: it waits
    await asyncio.sleep(0.05)
    queued.cancel()
    echo.release.set()
    assert [(await f).response for f in first] == [b"a", b"b"]
    await asyncio.sleep(0.1)
    assert echo.held == 2 and client.calls == 2


async def test_a_broken_stream_fails_the_calls_on_it_and_the_next_call_opens_another(relay: Any) -> None:
    client, echo, server, port, _ = relay
    echo.release.clear()
    waiting = asyncio.ensure_future(client.call(HOLD, b"lost", TICKET, 10.0))
    await asyncio.sleep(0.05)
    await server.stop(0)
    with pytest.raises(RelayCallError) as broken:
        await asyncio.wait_for(waiting, 5)
    assert broken.value.code == grpc.StatusCode.UNAVAILABLE
    echo.release.set()
    again = await start(echo, port)
    try:
        for _ in range(50):   # the channel reconnects with a back-off
            try:
                assert await client.call(ECHO, b"back", TICKET, 2.0) == b"back||deadline"
                break
            except RelayCallError as error:
                assert error.code == grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the relay never came back")
    finally:
        await again.stop(0)


async def test_large_calls_are_split_over_stream_messages_and_one_larger_than_the_cap_goes_alone(
        relay: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client, *_ = relay
    monkeypatch.setattr("broker.relay.MAX_MESSAGE_BYTES", 1000)
    bodies = [bytes([65 + i]) * 400 for i in range(5)] + [b"z" * 3000]
    answers = await asyncio.gather(*(client.call(ECHO, body, TICKET, 5.0) for body in bodies))
    assert answers == [body + b"||deadline" for body in bodies]
    # 400+400 | 400+400 | 400 (+3000 would pass the cap) | 3000 alone
    assert (client.messages, client.calls) == (4, 6)


class _MemberState:
    def add_listener(self, listener: Any) -> None:
        pass


class _Server:
    member_state = _MemberState()


async def test_a_relay_to_a_node_that_no_longer_leads_is_closed_once_idle_and_its_counts_kept() -> None:
    from broker.config import BrokerConfig
    from broker.forwarding import LeaderForwarder

    echo = Echo()
    ports = free_ports(3)
    servers = [await start(echo, port) for port in ports]
    first_leader, second_leader, third_leader = (f"127.0.0.1:{port}" for port in ports)
    forwarder = None
    try:
        forwarder = LeaderForwarder(_Server(), BrokerConfig("g", ("127.0.0.1:1",)))  # type: ignore[arg-type]
        first = forwarder._relay(first_leader)
        assert await first.call(ECHO, b"a", TICKET, 5.0) == b"a||deadline"
        echo.release.clear()   # a call still waiting on the first leader's relay...
        held = asyncio.ensure_future(first.call(HOLD, b"held", TICKET, 5.0))
        while echo.held == 0:
            await asyncio.sleep(0.01)
        second = forwarder._relay(second_leader)
        assert set(forwarder._relays) == {first_leader, second_leader}   # ...keeps it open
        echo.release.set()
        assert await held == b"held"
        await second.call(ECHO, b"b", TICKET, 5.0)
        third = forwarder._relay(third_leader)   # the next leader: both earlier relays are idle now
        assert set(forwarder._relays) == {third_leader}
        await asyncio.sleep(0.1)
        assert first._call is None and second._call is None   # their streams are closed
        assert forwarder.counts()[:2] == (3, 3)   # the closed relays' calls and messages still count
        assert await third.call(ECHO, b"c", TICKET, 5.0) == b"c||deadline"
        assert forwarder.counts()[:2] == (4, 4)
    finally:
        if forwarder is not None:
            await forwarder.close()
        for server in servers:
            await server.stop(0)
