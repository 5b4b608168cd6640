"""Replication over PeerStream: three real DLedgerServers in one process,
joined by real gRPC servers on loopback ports and GrpcTransport (the in-memory
network covers the Raft rules; this covers the stream that carries them).

A follower whose gRPC server goes away and comes back is caught up on a new
stream; an answer that does not come in time fails its caller with
TransportError and gives the stream up, and replication recovers on a new one.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import grpc
import pytest

from cluster.process_cluster import free_ports
from dledger.config import DLedgerConfig, PeerAddress
from dledger.member_state import Role
from dledger.rpc.peer_client import GrpcTransport
from dledger.rpc.service import DLedgerServicer
from dledger.server import DLedgerServer
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc
from tests.unit.raft_harness import FAST

pytestmark = pytest.mark.timeout(60)


@dataclass
class Node:
    server: DLedgerServer
    transport: GrpcTransport
    address: str
    grpc_server: grpc.aio.Server | None = None

    async def serve(self) -> None:
        """(Re)start the node's gRPC server on its port."""
        self.grpc_server = grpc.aio.server()
        dledger_pb2_grpc.add_DLedgerServiceServicer_to_server(DLedgerServicer(self.server, os.getpid(), ""),
                                                              self.grpc_server)
        self.grpc_server.add_insecure_port(self.address)
        await self.grpc_server.start()

    async def unserve(self) -> None:
        assert self.grpc_server is not None
        await self.grpc_server.stop(grace=None)
        self.grpc_server = None


async def start_cluster(tmp_path) -> dict[str, Node]:  # noqa: ANN001
    ports = free_ports(3)
    peers = tuple(PeerAddress(f"n{i}", "127.0.0.1", port) for i, port in enumerate(ports))
    nodes = {}
    for peer in peers:
        config = DLedgerConfig(self_id=peer.id, peers=peers, data_dir=str(tmp_path / peer.id), **FAST)
        transport = GrpcTransport(config)
        node = Node(DLedgerServer(config, transport), transport, peer.address)
        await node.serve()
        nodes[peer.id] = node
    for node in nodes.values():
        await node.server.start()
    return nodes


async def stop_cluster(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        await node.server.shutdown()
        if node.grpc_server is not None:
            await node.unserve()
        await node.transport.close()


async def wait_for(condition, timeout: float = 10.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def leader_of(nodes: dict[str, Node]) -> str | None:
    """The one leader, once it is ready for appends (its first entry committed)."""
    leaders = [n for n, node in nodes.items() if node.server.member_state.role is Role.LEADER]
    if len(leaders) != 1 or nodes[leaders[0]].server.pusher is None or \
            not nodes[leaders[0]].server.pusher.is_ready():
        return None
    return leaders[0]


async def append(node: Node, count: int) -> int:
    response = await node.server.handle_append(pb.AppendRequest(header=pb.Header(group="default"),
                                                                bodies=[b"x" * 100] * count, sequence=-1))
    return response.last_index


def holds(node: Node, index: int) -> bool:
    return node.server.store.ledger_end_index >= index and node.server.member_state.committed_index >= index


async def test_a_follower_cut_off_and_back_is_caught_up_on_a_new_stream(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        leader = nodes[leader_of(nodes)]
        follower_id = next(n for n in nodes if n != leader_of(nodes))
        last = await append(leader, 10)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        first_stream = leader.transport._streams[follower_id]

        await nodes[follower_id].unserve()
        last = await append(leader, 10)   # committed by the other follower
        await wait_for(lambda: first_stream.broken is not None)
        assert not holds(nodes[follower_id], last)

        await nodes[follower_id].serve()
        await wait_for(lambda: holds(nodes[follower_id], last))
        assert leader.transport._streams[follower_id] is not first_stream
    finally:
        await stop_cluster(nodes)


async def test_an_overdue_answer_fails_its_caller_and_replication_goes_on_on_a_new_stream(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        leader_id = leader_of(nodes)
        leader = nodes[leader_id]
        follower_id = next(n for n in nodes if n != leader_id)
        last = await append(leader, 5)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        stream = leader.transport._streams[follower_id]
        header = pb.Header(group="default", remote_id=follower_id, local_id=leader_id, leader_id=leader_id,
                           term=leader.server.member_state.term)
        # An APPEND past a gap waits on the follower (up to follower_gap_timeout_s)
        # for the entries before it; the heartbeat sent after it is answered first.
        stuck = asyncio.ensure_future(leader.transport.push(
            follower_id, pb.PushEntryRequest(header=header, type=pb.APPEND, index=last + 1000, entries=b"?",
                                             entry_count=1, committed_index=last), timeout=0.2))
        beat = await leader.transport.heartbeat(
            follower_id, pb.HeartBeatRequest(header=header, committed_index=last), timeout=1.0)
        assert beat.header.code == 200 and not stuck.done()
        with pytest.raises(TransportError, match="no answer within"):
            await stuck
        assert stream.broken is not None

        last = await append(leader, 5)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        assert leader.transport._streams[follower_id] is not stream
    finally:
        await stop_cluster(nodes)
