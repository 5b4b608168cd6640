"""Log clients' appends over client links (dledger/rpc/client_link.py):
three real DLedgerServers in one process behind real gRPC servers and real
link listeners on loopback ports, and a real DLedgerClient.

The client learns the leader's link port from an AppendStream answer and
moves its appends there; a link the node refuses, or cannot be reached,
leaves the client on AppendStream; a leader that dies under a link is
followed to the next leader without a lost or doubled append; a malformed
frame drops only its own connection; a follower's link redirects as the
stream does; a connection with too many requests waiting is not read
further until answers drain.
"""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from dledger import client as client_module
from dledger.client import DLedgerClient
from dledger.rpc.client_link import ClientLinkServer, open_client_link
from dledger.errors import ResponseCode
from dledger.rpc.link import LENGTH, MAX_REQUESTS_IN_FLIGHT, LinkRefused, LinkServer
from rpcgen import dledger_pb2 as pb
from tests.unit.grpc_harness import leader_of, start_cluster, stop_cluster, wait_for

pytestmark = pytest.mark.timeout(60)


async def _serve_client_links(nodes, check=None):  # noqa: ANN001, ANN202
    servers = {}
    for node_id, node in nodes.items():
        servers[node_id] = ClientLinkServer(node.server, check, None)
        node.server.client_link_port = await servers[node_id].start("127.0.0.1", 0)
    return servers


@contextlib.asynccontextmanager
async def _cluster_with_links(tmp_path, check=None):  # noqa: ANN001, ANN202
    """Three nodes, each serving a client link, once one leads."""
    nodes = await start_cluster(tmp_path)
    links = await _serve_client_links(nodes, check)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        yield nodes, links
    finally:
        await _stop(nodes, links)


async def _stop(nodes, links) -> None:  # noqa: ANN001
    for link_server in links.values():
        await link_server.stop()
    await stop_cluster(nodes)


async def _append_until_linked(client: DLedgerClient, tries: int = 100) -> None:
    for _ in range(tries):
        await client.append([b"warm-up"])
        if client.appends_by_path["link"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the client never used a link: {client.appends_by_path}")


async def test_appends_move_to_the_leaders_link_once_an_answer_names_it(tmp_path):
    async with _cluster_with_links(tmp_path) as (nodes, links):
        leader = leader_of(nodes)
        async with DLedgerClient([n.address for n in nodes.values()]) as client:
            await _append_until_linked(client)
            before = dict(client.appends_by_path)
            results = await asyncio.gather(*(client.append([f"body {i}".encode()]) for i in range(50)))
            assert client.appends_by_path["stream"] == before["stream"]
            assert client.appends_by_path["link"] > before["link"]
            assert links[leader].appends >= 1 and len(links[leader].connections) == 1
            for i, result in enumerate(results):
                assert (await client.get(result.first_index)).body == f"body {i}".encode()


async def test_a_refused_link_leaves_the_client_on_append_stream(tmp_path):
    refusals: list[str] = []

    def refuse(hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> str:
        refusals.append(hello.sender_id)
        return "not today"

    async with _cluster_with_links(tmp_path, refuse) as (nodes, links):
        async with DLedgerClient([n.address for n in nodes.values()]) as client:
            for _ in range(20):
                await client.append([b"x"])
                await asyncio.sleep(0.01)
            assert client.appends_by_path["link"] == 0 and client.appends_by_path["stream"] == 20
            assert len(refusals) == 1   # then it rests LINK_REFUSED_RETRY_S before trying again
            with pytest.raises(LinkRefused, match="not today"):
                await open_client_link(f"127.0.0.1:{nodes[leader_of(nodes)].server.client_link_port}",
                                       "127.0.0.1", "default", "me", None, None, 2.0, lambda link: None)
            with pytest.raises(LinkRefused, match="of group 'default', not of 'other'"):
                await open_client_link(f"127.0.0.1:{nodes[leader_of(nodes)].server.client_link_port}",
                                       "127.0.0.1", "other", "me", None, None, 2.0, lambda link: None)


async def test_a_link_that_cannot_be_dialed_costs_no_append(tmp_path, monkeypatch):
    monkeypatch.setattr(client_module, "LINK_RETRY_S", 0.2)
    async with _cluster_with_links(tmp_path) as (nodes, links):
        leader = leader_of(nodes)
        port = nodes[leader].server.client_link_port
        await links[leader].stop()   # the node still names its port: down, not gone
        async with DLedgerClient([n.address for n in nodes.values()]) as client:
            for _ in range(10):
                await client.append([b"x"])
            assert client.appends_by_path["link"] == 0
            links[leader] = ClientLinkServer(nodes[leader].server, None, None)
            await links[leader].start("127.0.0.1", port)
            await _append_until_linked(client)


async def test_a_leader_that_dies_under_its_link_loses_and_doubles_nothing(tmp_path):
    nodes = await start_cluster(tmp_path)
    links = await _serve_client_links(nodes)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        old = leader_of(nodes)
        async with DLedgerClient([n.address for n in nodes.values()], deadline_s=20.0) as client:
            await _append_until_linked(client)
            bodies = [f"failover {i}".encode() for i in range(40)]
            appends = [asyncio.ensure_future(client.append([body])) for body in bodies[:20]]
            await asyncio.sleep(0)
            await links[old].stop()                  # every link to it cut, with appends in flight
            await nodes[old].server.shutdown()
            await nodes[old].unserve()
            appends += [asyncio.ensure_future(client.append([body])) for body in bodies[20:]]
            results = await asyncio.gather(*appends)
            assert leader_of({k: v for k, v in nodes.items() if k != old}) not in (None, old)
            await _append_until_linked(client)       # on the new leader's link
            indexes = [r.first_index for r in results]
            assert len(set(indexes)) == len(bodies)
            for body, index in zip(bodies, indexes):
                assert (await client.get(index)).body == body
            seen = [e.body async for e in client.read(0)]
            assert all(seen.count(body) == 1 for body in bodies)
    finally:
        await _stop({k: v for k, v in nodes.items() if k != old}, {k: v for k, v in links.items() if k != old})
        await nodes[old].transport.close()


async def test_a_followers_link_redirects_and_a_malformed_frame_drops_only_its_connection(tmp_path):
    async with _cluster_with_links(tmp_path) as (nodes, links):
        follower = next(n for n in nodes if n != leader_of(nodes))
        link = await open_client_link(f"127.0.0.1:{nodes[follower].server.client_link_port}", "127.0.0.1",
                                      "default", "direct", None, None, 2.0, lambda broken: None)
        request = pb.AppendStreamRequest(append=pb.AppendRequest(header=pb.Header(group="default"),
                                                                 bodies=[b"x"], sequence=-1))
        answer = await link.request(request, 5.0)
        assert answer.header.code == ResponseCode.NOT_LEADER and answer.header.leader_id == leader_of(nodes)
        assert answer.link_port == nodes[follower].server.client_link_port

        _, writer = await asyncio.open_connection("127.0.0.1", nodes[follower].server.client_link_port)
        writer.write(LENGTH.pack(1 << 30))   # a length past the limit: not a frame
        await writer.drain()
        await wait_for(lambda: len(links[follower].connections) == 1)   # only the good link stays
        assert (await link.request(request, 5.0)).header.leader_id == leader_of(nodes)
        writer.close()
        link.close("done")


class _Held(LinkServer[pb.AppendStreamRequest, pb.AppendStreamResponse]):
    """A listener whose answers wait until released."""

    def __init__(self) -> None:
        super().__init__(None)
        self.release = asyncio.Event()
        self.started = 0

    def group_and_id(self) -> tuple[str, str]:
        return "default", "held"

    def refusal(self, hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> str:
        return ""

    def parse(self, body: bytes) -> pb.AppendStreamRequest:
        return pb.AppendStreamRequest.FromString(body)

    async def respond(self, request: pb.AppendStreamRequest) -> pb.AppendStreamResponse:
        self.started += 1
        await self.release.wait()
        return pb.AppendStreamResponse(id=request.id)


async def test_a_listener_stops_reading_a_connection_with_too_many_requests_waiting():
    server = _Held()
    port = await server.start("127.0.0.1", 0)
    try:
        link = await open_client_link(f"127.0.0.1:{port}", "127.0.0.1", "default", "flood", None, None, 2.0,
                                      lambda broken: None)
        count = MAX_REQUESTS_IN_FLIGHT + 100
        requests = [asyncio.ensure_future(link.request(pb.AppendStreamRequest(), 10.0)) for _ in range(count)]
        await wait_for(lambda: server.started >= MAX_REQUESTS_IN_FLIGHT)
        await asyncio.sleep(0.2)
        assert server.started == MAX_REQUESTS_IN_FLIGHT   # the rest wait unread in the socket
        server.release.set()
        answers = await asyncio.gather(*requests)
        assert server.started == count and len({a.id for a in answers}) == count
        link.close("done")
    finally:
        await server.stop()


async def test_an_append_larger_than_a_links_frame_goes_on_the_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(client_module, "LINK_MAX_PAYLOAD_BYTES", 1000)
    async with _cluster_with_links(tmp_path) as (nodes, links):
        async with DLedgerClient([n.address for n in nodes.values()]) as client:
            await _append_until_linked(client)
            before = dict(client.appends_by_path)
            result = await client.append([b"x" * 600, b"y" * 600])   # 1,200 bytes: over the link's 1,000
            assert client.appends_by_path["stream"] == before["stream"] + 1
            assert client.appends_by_path["link"] == before["link"]
            assert (await client.get(result.last_index)).body == b"y" * 600
            await client.append([b"z" * 600])
            assert client.appends_by_path["link"] == before["link"] + 1
