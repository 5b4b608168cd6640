"""Replication over peer links (dledger/rpc/peer_link.py): three real
DLedgerServers in one process, each behind a real gRPC server and a real
link listener on loopback ports, reaching each other through GrpcTransport.

A leader learns a follower's link port from a heartbeat answer and moves its
pushes there; a link that is down leaves the follower on PeerStream until it
comes back; an overdue answer gives the link up; a handshake from another
group or without the members' credentials is refused; a malformed frame
drops only its own connection.
"""
from __future__ import annotations

import asyncio
import socket

import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.rpc import peer_client
from dledger.rpc.peer_client import GrpcTransport
from dledger.rpc.peer_link import LENGTH, FrameError, FrameReader, LinkRefused, PeerLinkServer, frame, open_link
from rpcgen import dledger_pb2 as pb
from tests.unit.grpc_harness import append, overdue_push_beside_a_heartbeat, holds, leader_of, start_cluster, stop_cluster, wait_for

pytestmark = pytest.mark.timeout(60)


def test_frames_are_cut_wherever_the_bytes_break():
    messages = [pb.PeerLinkWelcome(refused="x" * n) for n in (0, 1, 300)]
    stream = b"".join(frame(m) for m in messages)
    reader = FrameReader()
    bodies = [body for i in range(0, len(stream), 7) for body in reader.feed(stream[i:i + 7])]
    assert [pb.PeerLinkWelcome.FromString(b) for b in bodies] == messages
    with pytest.raises(FrameError, match="at most 16"):
        FrameReader(max_bytes=16).feed(LENGTH.pack(17))


async def _leader_with_links(nodes):  # noqa: ANN001, ANN202
    await wait_for(lambda: leader_of(nodes) is not None)
    leader = nodes[leader_of(nodes)]
    followers = [n for n in nodes if n != leader_of(nodes)]
    await wait_for(lambda: set(leader.transport._links) == set(followers))
    return leader, followers


async def test_pushes_and_heartbeats_go_over_links_once_a_heartbeat_names_the_port(tmp_path):
    nodes = await start_cluster(tmp_path, links=True)
    try:
        leader, _ = await _leader_with_links(nodes)
        before = dict(leader.transport.requests_by_path)
        last = await append(leader, 50)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        after = leader.transport.requests_by_path
        assert after["link"] > before["link"] and after["stream"] == before["stream"]
    finally:
        await stop_cluster(nodes)


async def test_a_follower_whose_link_is_down_is_replicated_over_peer_stream_until_it_is_back(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_client, "LINK_RETRY_S", 0.5)
    nodes = await start_cluster(tmp_path, links=True)
    try:
        leader, followers = await _leader_with_links(nodes)
        follower = nodes[followers[0]]
        port = follower.server.peer_link_port
        await follower.unserve_link()
        await wait_for(lambda: followers[0] not in leader.transport._links)
        streamed = leader.transport.requests_by_path["stream"]
        last = await append(leader, 20)
        await wait_for(lambda: holds(follower, last))
        assert leader.transport.requests_by_path["stream"] > streamed

        await follower.serve_link(port)
        await wait_for(lambda: followers[0] in leader.transport._links)
        linked = leader.transport.requests_by_path["link"]
        last = await append(leader, 20)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        assert leader.transport.requests_by_path["link"] > linked
    finally:
        await stop_cluster(nodes)


async def test_an_overdue_answer_fails_its_caller_and_replication_goes_on_on_a_new_link(tmp_path):
    nodes = await start_cluster(tmp_path, links=True)
    try:
        leader, followers = await _leader_with_links(nodes)
        follower_id = followers[0]
        last = await append(leader, 5)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        link = leader.transport._links[follower_id]
        await overdue_push_beside_a_heartbeat(leader, follower_id, last)
        assert link.broken is not None

        last = await append(leader, 5)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        assert leader.transport._links[follower_id] is not link
    finally:
        await stop_cluster(nodes)


async def test_a_link_from_another_group_or_without_the_members_credentials_is_refused(tmp_path):
    nodes = await start_cluster(tmp_path, links=True)
    secured = PeerLinkServer(nodes["n1"].server, ("admin", "the secret"), None)
    port = await secured.start("127.0.0.1", 0)
    try:
        async def dial(target: int, group: str = "default", signing=None):  # noqa: ANN001, ANN202
            return await open_link(f"127.0.0.1:{target}", "127.0.0.1", group, "n0", signing, None, 2.0,
                                   lambda link: None)

        with pytest.raises(LinkRefused, match="of group 'default', not of 'other'"):
            await dial(port, group="other")
        with pytest.raises(LinkRefused, match="no valid proof"):
            await dial(port)
        with pytest.raises(LinkRefused, match="no valid proof"):
            await dial(port, signing=("admin", "a guess"))
        link = await dial(port, signing=("admin", "the secret"))
        answer = await link.request(pb.PeerStreamRequest(heartbeat=pb.HeartBeatRequest(
            header=pb.Header(group="default", local_id="n0", remote_id="n1"))), 2.0)
        assert answer.WhichOneof("body") == "heartbeat"   # answered (an error: n0 does not lead)
        link.close("done")
    finally:
        await secured.stop()
        await stop_cluster(nodes)


async def test_a_malformed_frame_drops_only_its_own_connection(tmp_path):
    nodes = await start_cluster(tmp_path, links=True)
    try:
        leader, followers = await _leader_with_links(nodes)
        target = nodes[followers[0]].server.peer_link_port
        reader, writer = await asyncio.open_connection("127.0.0.1", target)
        writer.write(frame(pb.PeerLinkHello(group="default", sender_id="a stranger")))
        challenge = await reader.readexactly(LENGTH.unpack(await reader.readexactly(4))[0])
        assert pb.PeerLinkChallenge.FromString(challenge).group == "default"
        writer.write(LENGTH.pack(0xFFFFFFF0))   # a length past any frame
        assert await asyncio.wait_for(reader.read(), 5.0) == b""   # closed by the listener
        writer.close()
        last = await append(leader, 10)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        assert followers[0] in leader.transport._links
    finally:
        await stop_cluster(nodes)


async def test_a_peer_behind_a_route_is_reached_through_the_route_or_not_over_a_link():
    peers = (PeerAddress("n0", "127.0.0.1", 1), PeerAddress("n1", "127.0.0.1", 2))
    routed_grpc = DLedgerConfig(self_id="n0", peers=peers, data_dir="/nonexistent",
                                peer_routes=(("127.0.0.1:2", "127.0.0.1:9002"),))
    transport = GrpcTransport(routed_grpc)
    try:
        transport._learn_link("n1", 7002)
        assert transport._link_address("n1") is None   # not around the proxy
    finally:
        await transport.close()
    both = DLedgerConfig(self_id="n0", peers=peers, data_dir="/nonexistent",
                         peer_routes=(("127.0.0.1:2", "127.0.0.1:9002"), ("127.0.0.1:7002", "127.0.0.1:9702")))
    transport = GrpcTransport(both)
    try:
        transport._learn_link("n1", 7002)
        assert transport._link_address("n1") == "127.0.0.1:9702"
        transport._learn_link("n1", 0)   # restarted without a link
        assert transport._link_address("n1") is None
    finally:
        await transport.close()


async def test_a_link_that_cannot_be_dialed_leaves_the_peer_on_peer_stream_for_a_while():
    peers = (PeerAddress("n0", "127.0.0.1", 1), PeerAddress("n1", "127.0.0.1", 2))
    transport = GrpcTransport(DLedgerConfig(self_id="n0", peers=peers, data_dir="/nonexistent"))
    with socket.socket() as probe:   # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    try:
        transport._learn_link("n1", closed)
        assert transport._link("n1") is None   # this request: PeerStream; the link is dialed meanwhile
        dialing = transport._dialer.dialing["n1"]
        with pytest.raises(OSError):
            await dialing
        await asyncio.sleep(0)   # the dial's outcome is recorded by its done callback
        assert transport._link("n1") is None and "n1" not in transport._dialer.dialing   # not dialed again yet
        assert transport._dialer.off_until["n1"] > asyncio.get_running_loop().time() - 1
    finally:
        await transport.close()
