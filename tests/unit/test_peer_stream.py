"""Replication over PeerStream: three real DLedgerServers in one process,
joined by real gRPC servers on loopback ports and GrpcTransport (the in-memory
network covers the Raft rules; this covers the stream that carries them).

A follower whose gRPC server goes away and comes back is caught up on a new
stream; an answer that does not come in time fails its caller with
TransportError and gives the stream up, and replication recovers on a new one.
"""
from __future__ import annotations

import asyncio

import pytest

from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from tests.unit.grpc_harness import append, overdue_push_beside_a_heartbeat, holds, leader_of, start_cluster, stop_cluster, wait_for

pytestmark = pytest.mark.timeout(60)


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
        await overdue_push_beside_a_heartbeat(leader, follower_id, last)
        assert stream.broken is not None

        last = await append(leader, 5)
        await wait_for(lambda: all(holds(node, last) for node in nodes.values()))
        assert leader.transport._streams[follower_id] is not stream
    finally:
        await stop_cluster(nodes)


async def test_a_channel_closed_under_a_waiting_push_fails_it_at_once(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        leader_id = leader_of(nodes)
        leader = nodes[leader_id]
        follower_id = next(n for n in nodes if n != leader_id)
        last = await append(leader, 1)
        header = pb.Header(group="default", remote_id=follower_id, local_id=leader_id, leader_id=leader_id,
                           term=leader.server.member_state.term)
        waiting = asyncio.ensure_future(leader.transport.push(   # held by the follower for its gap
            follower_id, pb.PushEntryRequest(header=header, type=pb.APPEND, index=last + 1000, entries=b"?",
                                             entry_count=1, committed_index=last), timeout=5.0))
        await asyncio.sleep(0.1)
        stream = leader.transport._streams[follower_id]
        loop = asyncio.get_running_loop()
        started = loop.time()
        await leader.transport._channels[follower_id].close()
        with pytest.raises(TransportError):
            await waiting
        assert loop.time() - started < 1.0 and stream.broken is not None
    finally:
        await stop_cluster(nodes)


async def test_a_follower_of_an_earlier_version_without_peer_stream_is_replicated_by_unary_calls(tmp_path):
    """A rolling upgrade mixes versions: a node whose server has no PeerStream
    (it answers UNIMPLEMENTED) is sent unary Push and HeartBeat calls, and
    catches up like the others."""
    import grpc

    from dledger.rpc.service import DLedgerServicer

    class EarlierVersion(DLedgerServicer):
        async def PeerStream(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        old_id = next(n for n in nodes if n != leader_of(nodes))
        old = nodes[old_id]
        await old.unserve()
        await old.serve(EarlierVersion)
        leader = nodes[leader_of(nodes)]
        last = await append(leader, 20)
        await wait_for(lambda: holds(old, last), timeout=15)
        assert old_id in leader.transport._unary_until
    finally:
        await stop_cluster(nodes)
