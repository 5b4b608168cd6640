"""The fault proxies with real TCP connections on loopback: a cut, a one-way
drop and a delay take effect on a connection that is already open, and
healing closes the connections whose streams lost bytes (and only those)."""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import pytest

from cluster.chaos.network import FaultNetwork
from cluster.chaos.proxy import LinkProxy, LinkState

pytestmark = pytest.mark.timeout(30)

SILENCE_S = 0.3  # "nothing arrives": how long to listen


class RecordingServer:
    """The destination: records what it receives, and can send on its own."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.writers: list[asyncio.StreamWriter] = []
        self.arrived = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        while data := await reader.read(1 << 16):
            self.received += data
            self.arrived.set()
            if data.startswith(b"ping"):
                writer.write(b"pong")
                await writer.drain()

    async def push(self, data: bytes) -> None:
        """Send `data` to every connected client, unasked."""
        for writer in self.writers:
            writer.write(data)
            await writer.drain()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self.writers:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[RecordingServer]:
    s = RecordingServer()
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def proxy(server: RecordingServer) -> AsyncIterator[LinkProxy]:
    p = LinkProxy("a", "b", server.address)
    await p.start()
    yield p
    await p.close()


async def connect(proxy: LinkProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = proxy.address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def read_within(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What arrives within `seconds` (b"" at end of stream), None for silence."""
    try:
        return await asyncio.wait_for(reader.read(1 << 16), seconds)
    except asyncio.TimeoutError:
        return None


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
    writer.write(b"ping")
    await writer.drain()
    return await read_within(reader, 2.0)


async def test_healthy_link_carries_both_directions(proxy: LinkProxy, server: RecordingServer):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    await server.push(b"unasked")
    assert await read_within(reader, 2.0) == b"unasked"
    writer.close()


async def test_cut_silences_an_open_connection_without_closing_it(proxy: LinkProxy, server: RecordingServer):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    server.received.clear()
    proxy.set_state(LinkState(drop_forward=True, drop_backward=True))
    writer.write(b"lost request")
    await writer.drain()
    await server.push(b"lost reply")
    assert await read_within(reader, SILENCE_S) is None   # silence, not a closed connection
    assert bytes(server.received) == b""
    assert proxy.dropped_bytes >= len(b"lost request") + len(b"lost reply")


async def test_heal_closes_connections_that_lost_bytes_and_new_ones_work(proxy: LinkProxy, server: RecordingServer):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    proxy.set_state(LinkState(drop_forward=True, drop_backward=True))
    writer.write(b"lost")
    await writer.drain()
    await asyncio.sleep(0.1)
    proxy.heal()
    assert await read_within(reader, 2.0) == b""   # closed: the stream had a hole
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"


async def test_heal_keeps_connections_that_lost_nothing(proxy: LinkProxy):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    proxy.set_state(LinkState(drop_forward=True, drop_backward=True))
    await asyncio.sleep(0.1)   # nothing sent meanwhile
    proxy.heal()
    assert await round_trip(reader, writer) == b"pong"


async def test_one_way_forward_drop_loses_requests_but_replies_still_flow(proxy: LinkProxy, server: RecordingServer):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    server.received.clear()
    server.arrived.clear()
    proxy.set_state(LinkState(drop_forward=True))
    writer.write(b"never arrives")
    await writer.drain()
    await server.push(b"still arrives")
    assert await read_within(reader, 2.0) == b"still arrives"
    await asyncio.sleep(SILENCE_S)
    assert bytes(server.received) == b""


async def test_one_way_backward_drop_delivers_requests_but_loses_replies(proxy: LinkProxy, server: RecordingServer):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    server.received.clear()
    server.arrived.clear()
    proxy.set_state(LinkState(drop_backward=True))
    assert await round_trip(reader, writer) is None     # the pong is dropped...
    assert bytes(server.received) == b"ping"             # ...but the ping arrived


async def test_new_connection_during_forward_drop_never_reaches_the_destination(proxy: LinkProxy,
                                                                                server: RecordingServer):
    proxy.set_state(LinkState(drop_forward=True))
    reader, writer = await connect(proxy)
    writer.write(b"hello?")
    await writer.drain()
    await asyncio.sleep(SILENCE_S)
    assert server.writers == []   # the proxy never connected onwards


async def test_delay_slows_an_open_connection_and_undelay_restores_it(proxy: LinkProxy):
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) == b"pong"
    proxy.set_state(LinkState(delay_forward_s=0.15, delay_backward_s=0.15))
    started = time.monotonic()
    assert await round_trip(reader, writer) == b"pong"
    assert time.monotonic() - started >= 0.3
    proxy.heal()
    started = time.monotonic()
    assert await round_trip(reader, writer) == b"pong"
    assert time.monotonic() - started < 0.15


async def test_network_drop_from_a_to_b_uses_both_links_that_carry_a_bytes():
    network = FaultNetwork({"a": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.1:3"})
    network.drop("a", "b")
    assert network.links[("a", "b")].state == LinkState(drop_forward=True)    # a's requests to b
    assert network.links[("b", "a")].state == LinkState(drop_backward=True)   # a's replies to b
    assert network.links[("a", "c")].state == LinkState()
    assert network.links[("c", "a")].state == LinkState()


async def test_network_overlapping_faults_heal_independently():
    network = FaultNetwork({"a": "127.0.0.1:1", "b": "127.0.0.1:2"})
    network.drop("a", "b")
    network.drop("a", "b")      # a second fault cuts the same direction
    network.undrop("a", "b")    # the first one heals
    assert network.links[("a", "b")].state.drop_forward
    network.undrop("a", "b")
    assert network.links[("a", "b")].state == LinkState()
    network.delay("a", "b", 0.1)
    network.delay("a", "b", 0.3)
    network.undelay("a", "b", 0.3)
    assert network.links[("a", "b")].state.delay_forward_s == 0.1
    assert network.links[("b", "a")].state.delay_backward_s == 0.1


async def test_network_routes_send_each_node_through_its_own_links():
    network = FaultNetwork({"a": "127.0.0.1:1", "b": "127.0.0.1:2"})
    await network.start()
    try:
        routes = network.routes()
        # Each node dials, for the other's real address, the proxy of its own link.
        assert routes["a"] == {"127.0.0.1:2": network.links[("a", "b")].address}
        assert routes["b"] == {"127.0.0.1:1": network.links[("b", "a")].address}
        # A node that may move to a second address is reached through the same link.
        moving = network.routes({"a": ["127.0.0.1:1"], "b": ["127.0.0.1:2", "127.0.0.1:3"]})
        assert moving["a"] == {"127.0.0.1:2": network.links[("a", "b")].address,
                               "127.0.0.1:3": network.links[("a", "b")].address}
        network.retarget("b", "127.0.0.1:3")
        assert network.links[("a", "b")].target_port == 3 and network.links[("b", "a")].target_port == 1
    finally:
        await network.close()


async def test_network_puts_a_second_proxy_in_front_of_each_peer_link_and_faults_act_on_both():
    link_of = {"127.0.0.1:1": "127.0.0.1:11", "127.0.0.1:2": "127.0.0.1:12", "127.0.0.1:3": "127.0.0.1:13"}
    network = FaultNetwork({"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, link_of=link_of)
    await network.start()
    try:
        routes = network.routes({"a": ["127.0.0.1:1"], "b": ["127.0.0.1:2", "127.0.0.1:3"]})
        via_link = network.peer_link_proxies[("a", "b")].address
        assert routes["a"] == {"127.0.0.1:2": network.links[("a", "b")].address, "127.0.0.1:12": via_link,
                               "127.0.0.1:3": network.links[("a", "b")].address, "127.0.0.1:13": via_link}
        network.drop("a", "b")
        assert network.peer_link_proxies[("a", "b")].state == LinkState(drop_forward=True)
        assert network.peer_link_proxies[("b", "a")].state == LinkState(drop_backward=True)
        network.heal_all()
        assert network.peer_link_proxies[("a", "b")].state == LinkState()
        network.retarget("b", "127.0.0.1:3")
        assert network.peer_link_proxies[("a", "b")].target_port == 13
    finally:
        await network.close()
