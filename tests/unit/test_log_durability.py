"""What a node acknowledges stays on its disk: the quorum counts only what
followers report as flushed, a failed fsync stops the node, and checkpoints
never point into dropped entries (issue 14's defects)."""
from __future__ import annotations

import asyncio

import pytest

from dledger.errors import DLedgerError, ResponseCode
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


def block_flushes(cluster: Cluster, node: str) -> asyncio.Event:
    """Make `node`'s fdatasync hang until the returned event is set (a slow
    or stuck disk): writes still land in the page cache."""
    store = cluster.servers[node].store
    release = asyncio.Event()
    real_round = store._flush_round

    async def slow_round() -> None:
        await release.wait()
        await real_round()

    store._flush_round = slow_round  # type: ignore[method-assign]
    return release


def lose_next_append_answer(cluster: Cluster, leader: str, follower: str) -> None:
    """The leader's next APPEND to `follower` is delivered, but the call
    fails at once (the connection broke after the request went out)."""
    dispatcher = cluster.servers[leader].pusher.dispatchers[follower]
    transport = dispatcher.transport
    real_push = transport.push
    background: list[asyncio.Future[pb.PushEntryResponse]] = []

    async def push(peer_id: str, request: pb.PushEntryRequest, timeout: float) -> pb.PushEntryResponse:
        if peer_id == follower and request.type == pb.APPEND and not background:
            delivery = asyncio.ensure_future(real_push(peer_id, request, timeout))
            delivery.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody waits for it
            background.append(delivery)
            raise TransportError("connection reset after the request was sent (test)")
        return await real_push(peer_id, request, timeout)

    transport.push = push  # type: ignore[method-assign]


async def test_a_follower_entry_that_is_not_on_disk_never_counts_toward_the_quorum(cluster: Cluster):
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    slow, cut = [n for n in cluster.servers if n != leader]
    await server.append([b"before"])
    await cluster.wait_converged()
    committed = server.member_state.committed_index
    # Only `slow` can make a quorum with the leader, and its disk hangs: its
    # APPEND answer never comes (the push times out), the dispatcher goes
    # back to COMPARE, and the follower matches at once. That match must not
    # make the leader count an entry the follower has not flushed.
    cluster.network.isolate(cut)
    release = block_flushes(cluster, slow)
    lose_next_append_answer(cluster, leader, slow)
    append = asyncio.ensure_future(server.append([b"not on the follower's disk yet"]))
    await asyncio.sleep(3 * cluster.configs[leader].push_timeout_s)
    assert cluster.servers[slow].store.ledger_end_index > committed, "the follower never got the entry"
    assert server.member_state.committed_index == committed, (
        "committed on a copy the follower has not flushed: " + cluster.describe())
    release.set()
    try:
        await append
    except DLedgerError as error:  # waited past max_wait_ack_s for the slow disk
        assert error.code is ResponseCode.WAIT_QUORUM_ACK_TIMEOUT
    for _ in range(200):
        if server.member_state.committed_index > committed:
            break
        await asyncio.sleep(0.02)
    assert server.member_state.committed_index > committed, cluster.describe()


async def test_a_follower_whose_fsync_fails_stops_and_never_acknowledges_again(cluster: Cluster):
    from dledger import failpoints, tasks
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    victim, other = [n for n in cluster.servers if n != leader]
    await server.append([b"before"])
    await cluster.wait_converged()
    stopped: list[str] = []
    tasks.set_crash_handler(lambda what, error: stopped.append(f"{what}: {error}"))
    # The victim alone makes the quorum with the leader; its next fdatasync
    # fails once. On Linux the fdatasync after that would "succeed" for pages
    # that may never reach the disk: the follower must not try again.
    cluster.network.isolate(other)
    failpoints.arm(failpoints.FSYNC, victim, times=1)
    try:
        with pytest.raises(DLedgerError) as error:
            await server.append([b"its fsync fails"])
        assert error.value.code is ResponseCode.WAIT_QUORUM_ACK_TIMEOUT
        store = cluster.servers[victim].store
        assert store.failure and "fdatasync failed" in store.failure
        assert stopped and "fdatasync failed" in stopped[0]
        committed = server.member_state.committed_index
        assert cluster.servers[victim].store.flushed_index <= committed
        await asyncio.sleep(5 * cluster.configs[leader].commit_push_interval_s)
        assert server.member_state.committed_index == committed, cluster.describe()
        with pytest.raises(DLedgerError) as refused:
            await store.flush()
        assert refused.value.code is ResponseCode.DISK_ERROR
    finally:
        tasks.set_crash_handler(None)
        failpoints.disarm_all()
