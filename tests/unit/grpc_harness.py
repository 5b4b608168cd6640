"""Three real DLedgerServers in one process, each behind a real gRPC server on
a loopback port and reaching the others through GrpcTransport: the streams
(PeerStream, AppendStream) exercised on real sockets, with fast timings.
With `links`, each also serves a peer link (dledger/rpc/peer_link.py), which
leaders then use for pushes and heartbeats."""
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
from dledger.rpc.peer_link import PeerLinkServer
from dledger.rpc.service import DLedgerServicer, add_dledger_service
from dledger.server import DLedgerServer
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import FAST


@dataclass
class Node:
    server: DLedgerServer
    transport: GrpcTransport
    address: str
    grpc_server: grpc.aio.Server | None = None
    link_server: PeerLinkServer | None = None

    async def serve(self, servicer: type[DLedgerServicer] = DLedgerServicer) -> None:
        """(Re)start the node's gRPC server on its port (with another servicer
        class: a node of an earlier version, say)."""
        self.grpc_server = grpc.aio.server()
        add_dledger_service(servicer(self.server, os.getpid(), ""), self.grpc_server)
        self.grpc_server.add_insecure_port(self.address)
        await self.grpc_server.start()

    async def unserve(self) -> None:
        assert self.grpc_server is not None
        await self.grpc_server.stop(grace=None)
        self.grpc_server = None

    async def serve_link(self, port: int = 0, auth: tuple[str, str] | None = None) -> int:
        """(Re)open the node's peer link; the port it listens on."""
        self.link_server = PeerLinkServer(self.server, auth, None)
        self.server.peer_link_port = await self.link_server.start("127.0.0.1", port)
        return self.server.peer_link_port

    async def unserve_link(self) -> None:
        """Close the link's port and every link it holds (the node keeps
        telling leaders its port: it is down, not gone)."""
        assert self.link_server is not None
        await self.link_server.stop()
        self.link_server = None


async def start_cluster(tmp_path, links: bool = False) -> dict[str, Node]:  # noqa: ANN001
    ports = free_ports(3)
    peers = tuple(PeerAddress(f"n{i}", "127.0.0.1", port) for i, port in enumerate(ports))
    nodes = {}
    for peer in peers:
        config = DLedgerConfig(self_id=peer.id, peers=peers, data_dir=str(tmp_path / peer.id), **FAST)
        transport = GrpcTransport(config)
        node = Node(DLedgerServer(config, transport), transport, peer.address)
        await node.serve()
        if links:
            await node.serve_link()
        nodes[peer.id] = node
    for node in nodes.values():
        await node.server.start()
    return nodes


async def stop_cluster(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        await node.server.shutdown()
        if node.grpc_server is not None:
            await node.unserve()
        if node.link_server is not None:
            await node.unserve_link()
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


async def overdue_push_beside_a_heartbeat(leader: Node, follower_id: str, last: int) -> None:
    """An APPEND past a gap waits on the follower (up to follower_gap_timeout_s)
    for the entries before it; the heartbeat sent after it on the same
    connection is answered first, and the push fails its caller with
    TransportError once its 0.2 s are up."""
    leader_id = leader.server.member_state.self_id
    header = pb.Header(group="default", remote_id=follower_id, local_id=leader_id, leader_id=leader_id,
                       term=leader.server.member_state.term)
    stuck = asyncio.ensure_future(leader.transport.push(
        follower_id, pb.PushEntryRequest(header=header, type=pb.APPEND, index=last + 1000, entries=b"?",
                                         entry_count=1, committed_index=last), timeout=0.2))
    beat = await leader.transport.heartbeat(
        follower_id, pb.HeartBeatRequest(header=header, committed_index=last), timeout=1.0)
    assert beat.header.code == 200 and not stuck.done()
    with pytest.raises(TransportError, match="no answer within"):
        await stuck


def holds(node: Node, index: int) -> bool:
    return node.server.store.ledger_end_index >= index and node.server.member_state.committed_index >= index
