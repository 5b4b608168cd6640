"""Reads never see a deposed leader's past (issue 14, defect 6): a leader
serves Get and leader reads only after a majority confirmed its leadership
once the read began (ReadIndex); a follower's read says it may lag."""
from __future__ import annotations

import asyncio

import pytest

from dledger.errors import DLedgerError, ResponseCode
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    # A long check-quorum window (the election timeout) is the gap a stale
    # leader would answer in.
    c = Cluster(str(tmp_path), election_timeout_min_s=2.0, election_timeout_max_s=3.0, rpc_timeout_s=0.3)
    await c.start()
    yield c
    await c.stop()


async def read_all(server, **fields) -> list[pb.ReadResponse]:  # noqa: ANN001
    batches = await server.handle_read(pb.ReadRequest(start_index=-1, end_index=-1, **fields))
    return [batch async for batch in batches]


async def test_a_cut_off_leader_refuses_reads_it_cannot_confirm(cluster: Cluster):
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    first, _, _ = await server.append([b"x"])
    assert (await server.handle_get(pb.GetRequest(index=first))).entry.body == b"x"
    cluster.network.isolate(leader)
    assert server.member_state.is_leader   # still thinks it leads: check-quorum has not fired
    with pytest.raises(DLedgerError) as refused:
        await server.handle_get(pb.GetRequest(index=first))
    assert refused.value.code is ResponseCode.NOT_LEADER
    with pytest.raises(DLedgerError) as refused_read:
        await read_all(server, require_leader=True)
    assert refused_read.value.code is ResponseCode.NOT_LEADER
    cluster.network.heal()


async def test_leader_reads_are_confirmed_and_follower_reads_are_marked(cluster: Cluster):
    leader = await cluster.wait_leader()
    await cluster.servers[leader].append([b"a", b"b"])
    await cluster.wait_converged()
    follower = next(n for n in cluster.servers if n != leader)
    assert all(b.leader_confirmed for b in await read_all(cluster.servers[leader]))
    answers = await read_all(cluster.servers[follower])
    assert answers and not any(b.leader_confirmed for b in answers)
    with pytest.raises(DLedgerError) as refused:
        await read_all(cluster.servers[follower], require_leader=True)
    assert refused.value.code is ResponseCode.NOT_LEADER


async def test_concurrent_reads_share_heartbeat_rounds(cluster: Cluster):
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    index, _, _ = await server.append([b"x"])
    before = server.elector.read_index.rounds
    answers = await asyncio.gather(*(server.handle_get(pb.GetRequest(index=index)) for _ in range(50)))
    assert all(a.entry.body == b"x" for a in answers)
    assert server.elector.read_index.rounds - before <= 2
