"""Damaged replicas repair themselves, and a node that lost its disk rejoins
as a non-voter (issue 14): a damaged entry found at start-up or by the
scrubber cuts the log; until the node holds again everything it may have
acknowledged it neither votes, campaigns nor counts toward a quorum."""
from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from dledger import server as server_module
from dledger.entry import HEADER_SIZE
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import Role
from dledger.read_pacer import Verdict
from dledger.vote_rules import VoterState, VoterView, decide_vote, no_intact_leader
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(str(tmp_path), scrub_bytes_per_s=8 << 20, scrub_pass_interval_s=0.5)
    await c.start()
    yield c
    await c.stop()


def body_byte(cluster: Cluster, node: str, index: int) -> tuple[str, int]:
    """(segment file, offset in it) of a body byte of entry `index` on `node`."""
    store = cluster.servers[node].store
    pos = store.position_of(index)
    segment = store._data.find(pos)
    return segment.path, pos - segment.start + HEADER_SIZE + 1


def flip(path: str, at: int, bit: int = 0x20) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ bit]))


def flip_body_byte(cluster: Cluster, node: str, index: int) -> None:
    flip(*body_byte(cluster, node, index))


async def eventually(condition, timeout: float = 10.0, what: str = "") -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not in time: {what}")
        await asyncio.sleep(0.02)


def vote_request(candidate: str, term: int, cluster_id: str, end_index: int = 10**6, end_term: int = 10**6
                 ) -> pb.VoteRequest:
    return pb.VoteRequest(header=pb.Header(local_id=candidate, term=term), ledger_end_index=end_index,
                          ledger_end_term=end_term, cluster_id=cluster_id)


async def test_a_damaged_committed_entry_found_while_running_is_repaired_from_the_leader(cluster: Cluster):
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    for i in range(20):
        await server.append([b"entry-%d" % i])
    await cluster.wait_converged()
    victim = next(n for n in cluster.servers if n != leader)
    cluster.network.isolate(victim)          # the repair waits until it hears the leader again
    flip_body_byte(cluster, victim, 5)
    ms = cluster.servers[victim].member_state
    await eventually(lambda: cluster.servers[victim].repairs == 1, what="the scrubber finds the damage")
    assert ms.repairing and ms.repair_until >= 19 and cluster.servers[victim].store.ledger_end_index == 4
    # Repairing: it judges candidates by the log it had before the cut, not
    # by the one it has now, and never campaigns.
    end_term = cluster.servers[leader].store.ledger_end_term
    assert ms.repair_floor == (end_term, ms.repair_until)
    elector = cluster.servers[victim].elector
    await asyncio.sleep(1.0)     # past the leader's lease: stickiness no longer answers first
    # (Pre-votes, which change nothing here; real votes: the test below.)
    behind = vote_request(leader, ms.term + 1, ms.cluster_id, end_index=10, end_term=end_term)
    behind.pre_vote = True
    assert elector.handle_vote(behind).result == pb.REJECT_REPAIRING     # ahead of its cut log, behind its old one
    covering = vote_request(leader, ms.term + 1, ms.cluster_id, end_index=ms.repair_until, end_term=end_term)
    covering.pre_vote = True
    assert elector.handle_vote(covering).result == pb.ACCEPT
    assert ms.role is not Role.LEADER and ms.repairing
    cluster.network.heal()
    await server.append([b"after"])
    await eventually(lambda: not ms.repairing, what="the repair completes")
    await cluster.wait_converged()
    assert cluster.log_of(victim) == cluster.log_of(leader)


async def test_a_scrub_pass_ends_at_what_was_committed_when_it_began_under_faster_writes(tmp_path):
    """A pass that chased the log's growing end never ended while writes
    outran it, so the oldest entries were never checked again. Here the
    scrubber checks one entry a tick (8 a second) while 40 a second are
    written: a pass must still end and the next start again from the log's begin."""
    # The scrubber at its rate whatever the machine's load: its yield to
    # writes (tested below) would slow it eightfold on a busy machine.
    c = Cluster(str(tmp_path), scrub_bytes_per_s=512 << 10, scrub_pass_interval_s=0.3, replay_yield_wait_share=0.0)
    await c.start()
    try:
        leader = await c.wait_leader()
        follower = c.servers[next(n for n in c.servers if n != leader)]
        starts: list[int] = []
        real = follower.store.find_damage

        def one_entry_a_tick(start_index: int, max_bytes: int) -> tuple[int, int]:
            starts.append(start_index)
            return real(start_index, 1)

        follower.store.find_damage = one_entry_a_tick  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        until = loop.time() + 3.0
        while loop.time() < until:
            await c.servers[leader].append([b"w"])
            await asyncio.sleep(0.025)
        begin = follower.store.ledger_begin_index
        passes = sum(1 for before, now in zip(starts, starts[1:]) if now == begin and before > begin)
        assert passes >= 1, f"the scrubber's pass never came back to the log's begin: {starts}"
    finally:
        await c.stop()


async def test_a_repairing_follower_does_not_count_toward_the_quorum(cluster: Cluster):
    leader = await cluster.wait_leader()
    server = cluster.servers[leader]
    await server.append([b"first"])
    await cluster.wait_converged()
    repairing, other = [n for n in cluster.servers if n != leader]
    cluster.servers[repairing].member_state.start_repair(10**9, 1)   # far from done
    cluster.network.isolate(other)
    with pytest.raises(DLedgerError) as error:
        await server.append([b"needs a real quorum"])
    assert error.value.code is ResponseCode.WAIT_QUORUM_ACK_TIMEOUT
    cluster.servers[repairing].member_state.finish_repair()
    cluster.network.heal()
    await cluster.wait_converged()


async def test_damage_found_at_start_up_makes_a_non_voter_until_it_catches_up(tmp_path):
    cluster = Cluster(str(tmp_path), checkpoint_interval_s=3600.0)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        for i in range(10):
            await cluster.servers[leader].append([b"e%d" % i])
        await cluster.wait_converged()
        victim = next(n for n in cluster.servers if n != leader)
        store = cluster.servers[victim].store
        store.write_checkpoint()
        end = store.ledger_end_index
        damaged = body_byte(cluster, victim, end)
        await cluster.stop(victim)
        flip(*damaged, bit=0x01)   # the entry recovery starts from (the checkpoint's): it is committed
        await cluster.start(victim)
        restarted = cluster.servers[victim]
        assert restarted.member_state.repairing and restarted.store.ledger_end_index < end
        # It records the log it had: a candidate must reach that for its vote.
        assert restarted.member_state.repair_floor == (cluster.servers[leader].store.ledger_end_term, end)
        assert restarted.repairs == 1
        await cluster.servers[leader].append([b"more"])
        await eventually(lambda: not restarted.member_state.repairing, what="repair completes")
        await cluster.wait_converged()
        assert cluster.log_of(victim) == cluster.log_of(leader)
    finally:
        await cluster.stop()


async def test_a_node_that_lost_its_disk_rejoins_as_a_non_voter(tmp_path):
    cluster = Cluster(str(tmp_path))
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        for i in range(10):
            await cluster.servers[leader].append([b"e%d" % i])
        await cluster.wait_converged()
        cluster_id = cluster.servers[leader].member_state.cluster_id
        assert cluster_id and all(s.member_state.cluster_id == cluster_id for s in cluster.servers.values())
        victim = next(n for n in cluster.servers if n != leader)
        term = cluster.servers[victim].member_state.term
        await cluster.stop(victim)
        shutil.rmtree(os.path.join(tmp_path, victim))            # a new, empty disk
        cluster.network.isolate(victim)                           # it hears no leader at first
        await cluster.start(victim)
        fresh = cluster.servers[victim]
        assert fresh.member_state.lost_state and not fresh.member_state.joined
        # The vote it may already have given in this term is gone: it gives none.
        answer = fresh.elector.handle_vote(vote_request(leader, term, cluster_id))
        assert answer.result == pb.REJECT_NOT_JOINED
        cluster.network.heal()
        await eventually(lambda: fresh.member_state.cluster_id == cluster_id, what="it learns the identity")
        await eventually(lambda: not fresh.member_state.repairing, what="it catches up")
        await cluster.wait_converged()
        assert cluster.log_of(victim) == cluster.log_of(leader)
        assert fresh.member_state.joined
    finally:
        await cluster.stop()


async def test_two_damaged_nodes_of_three_elect_the_healthy_one_and_repair(tmp_path):
    """The deadlock of the 10-minute broker chaos run: two of three nodes
    repairing at once, the leader restarted. The repairing nodes vote for the
    healthy node (its log reaches what they had), it leads, and both repair."""
    cluster = Cluster(str(tmp_path), scrub_bytes_per_s=8 << 20, scrub_pass_interval_s=0.3,
                      replay_yield_wait_share=0.0)   # the scrubbers at their rate on a busy machine
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        for i in range(20):
            await cluster.servers[leader].append([b"entry-%d" % i])
        await cluster.wait_converged()
        damaged = [n for n in cluster.servers if n != leader]
        await cluster.stop(leader)
        for node in damaged:
            flip_body_byte(cluster, node, 7)
        await eventually(lambda: all(cluster.servers[n].member_state.repairing for n in damaged),
                         what="both scrubbers find the damage")
        await cluster.start(leader)
        assert await cluster.wait_leader(timeout=15) == leader     # the only candidate: the others repair
        await cluster.servers[leader].append([b"after"])
        await eventually(lambda: not any(cluster.servers[n].member_state.repairing for n in damaged),
                         what="both repair")
        await cluster.wait_converged()
        for node in damaged:
            assert cluster.log_of(node) == cluster.log_of(leader)
    finally:
        await cluster.stop()


async def test_a_majority_damaged_at_the_same_committed_entry_refuses_clients_with_no_intact_copy(tmp_path):
    """Two of three nodes lose the same committed entry (damaged disks) while
    the third, which holds it, is down: nobody can be elected without losing
    it. Clients get NO_INTACT_COPY naming the entries and the nodes (not
    "no leader yet"); a read of the range on a damaged node says it lost
    them. Once the intact node is back it leads and repairs the others."""
    cluster = Cluster(str(tmp_path), scrub_bytes_per_s=8 << 20, scrub_pass_interval_s=0.3)
    await cluster.start()
    try:
        keeper = await cluster.wait_leader()
        for i in range(20):
            await cluster.servers[keeper].append([b"entry-%d" % i])
        await cluster.wait_converged()
        damaged = [n for n in cluster.servers if n != keeper]
        await cluster.stop(keeper)
        # Read once the keeper is down: on a busy machine it may have been
        # re-elected after converging and appended its new term's entry, which
        # then counts among what the damaged nodes hold (their repair floor).
        end = max(cluster.servers[n].store.ledger_end_index for n in damaged)
        for node in damaged:
            flip_body_byte(cluster, node, 7)
        await eventually(lambda: all(cluster.servers[n].member_state.repairing for n in damaged),
                         what="both scrubbers find the damage")
        await eventually(lambda: all(cluster.servers[n].elector.no_intact_copy() for n in damaged),
                         what="both learn that no reachable voter holds entry 7 intact")
        for node in damaged:
            server = cluster.servers[node]
            with pytest.raises(DLedgerError) as refused:
                await server.append([b"must not be taken"])
            assert refused.value.code is ResponseCode.NO_INTACT_COPY
            message = refused.value.message
            assert f"entries up to {end}" in message and all(n in message for n in damaged) \
                and f"unreachable: {keeper}" in message, message
            assert server.handle_metadata(pb.MetadataRequest(), 0, "").no_intact_copy == message
            with pytest.raises(DLedgerError) as unreadable:
                await server.handle_read(pb.ReadRequest(start_index=0, end_index=end))
            assert unreadable.value.code is ResponseCode.CORRUPT_LOG and "lost entries 7.." in \
                unreadable.value.message
        await cluster.start(keeper)
        assert await cluster.wait_leader(timeout=15) == keeper
        await cluster.servers[keeper].append([b"after"])
        await eventually(lambda: not any(cluster.servers[n].member_state.repairing for n in damaged),
                         what="both repair")
        await cluster.wait_converged()
        assert all(not cluster.servers[n].elector.no_intact_copy() for n in damaged)
    finally:
        await cluster.stop()


def test_no_intact_leader_names_what_is_lost_only_when_no_reachable_voter_can_lead():
    voters = ["n0", "n1", "n2"]
    floor = (3, 57)
    n0 = VoterState("n0", (3, 6), repairing=True, floor=floor)
    n1 = VoterState("n1", (3, 6), repairing=True, floor=(3, 50))
    assert "entries up to 57 (term 3)" in no_intact_leader(voters, [n0, n1])          # n2 down
    assert "unreachable: n2" in no_intact_leader(voters, [n0, n1])
    # A healthy voter whose log reaches every floor can lead: nothing to report.
    assert no_intact_leader(voters, [n0, n1, VoterState("n2", (3, 57))]) == ""
    # One that lacks entry 57 cannot (the repairing voters refuse it).
    short = no_intact_leader(voters, [n0, VoterState("n1", (2, 70)), VoterState("n2", (3, 40))])
    assert "n1 ends at entry 70" in short and "n2 ends at entry 40" in short
    # Nobody lost anything: no leader is an election or a partition, not this.
    assert no_intact_leader(voters, [VoterState("n0", (3, 6))]) == ""
    # A node that lost its disk grants no vote at all; a healthy voter can still lead.
    assert no_intact_leader(voters, [VoterState("n0", (0, -1), repairing=True), VoterState("n1", (3, 9))]) == ""
    assert "n0 (its disk)" in no_intact_leader(voters, [VoterState("n0", (0, -1), repairing=True)])


async def test_repairing_nodes_do_not_elect_a_node_that_lacks_what_they_had(tmp_path):
    """Raft's rule against the log a repairing node had: a candidate that
    missed entries the damaged node acknowledged gets none of its votes."""
    cluster = Cluster(str(tmp_path), scrub_bytes_per_s=8 << 20, scrub_pass_interval_s=0.3)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        for i in range(3):
            await cluster.servers[leader].append([b"before-%d" % i])
        await cluster.wait_converged()
        laggard = next(n for n in cluster.servers if n != leader)
        other = next(n for n in cluster.servers if n not in (leader, laggard))
        laggard_end = cluster.servers[laggard].store.ledger_end_index
        cluster.network.isolate(laggard)
        for i in range(10):
            await cluster.servers[leader].append([b"entry-%d" % i])   # committed by the leader and `other`
        # Damage cuts `other`'s log below the laggard's end: judged by its cut
        # log, it would elect the laggard and lose the ten committed entries.
        await cluster.stop(leader)     # first, so that it cannot repair `other` at once
        flip_body_byte(cluster, other, laggard_end)
        await eventually(lambda: cluster.servers[other].member_state.repairing, what="the damage is found")
        assert cluster.servers[other].store.ledger_end_index < laggard_end
        cluster.network.heal()
        await asyncio.sleep(2.0)   # many election timeouts: the laggard campaigns and must lose
        assert not any(s.member_state.is_leader for s in cluster.servers.values())
        await cluster.start(leader)
        assert await cluster.wait_leader(timeout=15) == leader
        await cluster.servers[leader].append([b"after"])
        await eventually(lambda: not cluster.servers[other].member_state.repairing, what="the repair")
        await cluster.wait_converged()
    finally:
        await cluster.stop()


async def test_two_wiped_nodes_do_not_found_a_second_cluster_beside_the_first(tmp_path):
    """Two of three disks wiped while the third node, which holds the cluster's
    identity, cannot lead (it repairs). Judged alone, the two empty nodes look
    like a fresh cluster; the third's vote answers name the identity, so they
    neither campaign nor vote for each other, even after a restart."""
    cluster = Cluster(str(tmp_path))
    await cluster.start()
    try:
        keeper = await cluster.wait_leader()
        for i in range(5):
            await cluster.servers[keeper].append([b"e%d" % i])
        await cluster.wait_converged()
        identity = cluster.servers[keeper].member_state.cluster_id
        wiped = [n for n in cluster.servers if n != keeper]
        for node in wiped:
            await cluster.stop(node)
            shutil.rmtree(os.path.join(tmp_path, node))
        ms = cluster.servers[keeper].member_state
        ms.start_repair(10**9, ms.term)     # it cannot lead now
        ms.change_to_candidate()
        for node in wiped:
            await cluster.start(node)
        await asyncio.sleep(2.5)            # many election timeouts
        for node in wiped:
            await cluster.stop(node)        # a restart before joining keeps it a non-voter
            await cluster.start(node)
        await asyncio.sleep(2.5)
        assert not any(s.member_state.is_leader for s in cluster.servers.values()), cluster.describe()
        for node in wiped:
            state = cluster.servers[node].member_state
            assert state.cluster_id == "" and state.lost_state and state.cluster_seen
        assert ms.cluster_id == identity
    finally:
        await cluster.stop()


def test_a_repairing_voter_judges_by_its_repair_floor():
    from dataclasses import replace
    view = VoterView(self_id="n1", peer_ids=frozenset({"n0", "n1", "n2"}), term=7, vote_for="", ledger_end_term=2,
                     ledger_end_index=4, leader_alive=False, taking_leadership=False, cluster_id="abc",
                     repairing=True, repair_floor=(5, 40))
    def decide(end_term: int, end_index: int, pre_vote: bool = False) -> int:  # noqa: E306
        return decide_vote(view, "n0", 8, end_term, end_index, pre_vote, False, "abc").result
    assert decide(5, 40) == pb.ACCEPT                     # reaches the log it had
    assert decide(6, 10) == pb.ACCEPT                     # a later last term is more up to date
    assert decide(5, 39) == pb.REJECT_REPAIRING           # ahead of its cut log, short of the old one
    assert decide(4, 100) == pb.REJECT_REPAIRING
    assert decide(5, 39, pre_vote=True) == pb.REJECT_REPAIRING
    assert decide(1, 100) == pb.REJECT_EXPIRED_LEDGER_TERM  # behind even its cut log
    # Without a floor (a node that lost its disk) it grants nothing, whatever the log.
    assert decide_vote(replace(view, repair_floor=None), "n0", 8, 99, 999, False, False, "abc").result \
        == pb.REJECT_REPAIRING
    # A vote already given in this term still binds it.
    assert decide_vote(replace(view, term=8, vote_for="n2"), "n0", 8, 5, 40, False, False, "abc").result \
        == pb.REJECT_ALREADY_VOTED


def test_vote_rules_for_identity_and_repair():
    view = VoterView(self_id="n1", peer_ids=frozenset({"n0", "n1", "n2"}), term=3, vote_for="", ledger_end_term=1,
                     ledger_end_index=5, leader_alive=False, taking_leadership=False, cluster_id="abc")
    def decide(v: VoterView, cluster_id: str) -> int:  # noqa: E306
        return decide_vote(v, "n0", 4, 1, 9, False, False, cluster_id).result
    assert decide(view, "abc") == pb.ACCEPT
    assert decide(view, "") == pb.ACCEPT                       # an older version's candidate
    assert decide(view, "xyz") == pb.REJECT_OTHER_CLUSTER
    from dataclasses import replace
    assert decide(replace(view, repairing=True), "abc") == pb.REJECT_REPAIRING
    fresh = replace(view, cluster_id="", joined=False, term=0)
    assert decide(fresh, "abc") == pb.REJECT_NOT_JOINED
    assert decide(fresh, "") == pb.ACCEPT                       # a new cluster's first election


async def test_a_store_whose_log_was_cut_for_repair_does_not_apply_entries_twice(tmp_path):
    from tests.unit.store_harness import StoreCluster, message
    cluster = StoreCluster(str(tmp_path), checkpoint_interval_s=3600.0)
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=1)
        leader = await cluster.wait_leader()
        for i in range(5):
            await cluster.stores[leader].put_messages([message("T", b"m%d" % i)])
        await cluster.wait_applied()
        victim = next(n for n in cluster.servers if n != leader)
        store = cluster.stores[victim]
        await store.persist_configs(force=True)
        await store.flush()
        applied = store.checkpoint.applied_index
        assert applied >= 0
        log_store = cluster.servers[victim].store
        log_store.write_checkpoint()
        damaged = body_byte(cluster, victim, log_store.ledger_end_index)
        await cluster.stop(victim)
        flip(*damaged)
        applied_at_start: list[int] = []
        real_start = type(cluster.stores[leader]).start

        async def recording_start(self):  # noqa: ANN001
            await real_start(self)
            applied_at_start.append(self.applied_index)

        type(cluster.stores[leader]).start = recording_start
        try:
            await cluster.start(victim)
        finally:
            type(cluster.stores[leader]).start = real_start
        assert cluster.servers[victim].member_state.repairing or cluster.servers[victim].repairs == 1
        assert applied_at_start == [applied]          # resumes after what it applied, not from the cut
        await cluster.stores[leader].put_messages([message("T", b"after")])
        await cluster.wait_applied(timeout=15)
        bodies = {n: [m.body for m in s.get_messages("T", 0, 0, 100).messages] for n, s in cluster.stores.items()}
        assert bodies[victim] == bodies[leader] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
    finally:
        await cluster.stop()


async def test_a_store_restarted_during_a_repair_found_while_running_keeps_its_consume_queues(tmp_path):
    """Damage found while running cuts the log; the store, which had applied
    past the cut, checkpoints; the node restarts before the repair is done.
    The checkpoint must still say how far the ConsumeQueues hold applied
    entries: before the fix it recorded the cut log's end, the restart
    dropped the units past it while resuming after the applied index, and
    the apply loop stopped at the first message ("would leave a gap")."""
    from tests.unit.store_harness import StoreCluster, message
    cluster = StoreCluster(str(tmp_path), checkpoint_interval_s=3600.0)
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=1)
        leader = await cluster.wait_leader()
        for i in range(6):
            await cluster.stores[leader].put_messages([message("T", b"m%d" % i)])
        await cluster.wait_applied()
        victim = next(n for n in cluster.servers if n != leader)
        cluster.network.isolate(victim)          # the repair must wait for the restart
        server, store = cluster.servers[victim], cluster.stores[victim]
        first_message = min(i for i in range(server.store.ledger_begin_index, server.store.ledger_end_index + 1)
                            if b"m0" in server.store.get(i).body)
        server.repair_damage(first_message)      # as the scrubber does on a bad CRC
        await store.flush()
        await cluster.stop(victim)
        cluster.network.heal()
        await cluster.start(victim)
        await cluster.stores[leader].put_messages([message("T", b"after")])
        await cluster.wait_applied(timeout=15)
        await eventually(lambda: not cluster.servers[victim].member_state.repairing, what="the repair")
        bodies = {n: [m.body for m in s.get_messages("T", 0, 0, 100).messages] for n, s in cluster.stores.items()}
        assert bodies[victim] == bodies[leader] == [b"m%d" % i for i in range(6)] + [b"after"]
    finally:
        await cluster.stop()


@pytest.fixture
async def unscrubbed(tmp_path):
    c = Cluster(str(tmp_path), scrub_bytes_per_s=0)   # the read, not the scrubber, must find it
    await c.start()
    yield c
    await c.stop()


async def test_a_read_that_meets_a_damaged_entry_answers_corrupt_log_and_starts_the_repair(unscrubbed: Cluster):
    cluster = unscrubbed
    leader = await cluster.wait_leader()
    for i in range(10):
        await cluster.servers[leader].append([b"e%d" % i])
    await cluster.wait_converged()
    victim = next(n for n in cluster.servers if n != leader)
    flip_body_byte(cluster, victim, 3)
    server = cluster.servers[victim]
    with pytest.raises(DLedgerError) as refused:
        batches = await server.handle_read(pb.ReadRequest(start_index=-1, end_index=-1))
        _ = [b async for b in batches]
    assert refused.value.code is ResponseCode.CORRUPT_LOG and "repairing" in refused.value.message
    assert server.repairs == 1
    await cluster.servers[leader].append([b"more"])
    await eventually(lambda: not server.member_state.repairing, what="the repair completes")
    await cluster.wait_converged()
    assert cluster.log_of(victim) == cluster.log_of(leader)


async def test_the_scrubber_slows_down_while_the_nodes_writes_wait_for_a_core(tmp_path, monkeypatch):
    """The replays' verdict (dledger/read_pacer.py) says YIELD: the scrubber
    checks SCRUB_YIELD_SLOWDOWN times fewer chunks a second; otherwise at its
    rate (8 chunks a second here)."""
    c = Cluster(str(tmp_path), scrub_bytes_per_s=512 << 10, scrub_pass_interval_s=0.0)
    await c.start()
    try:
        leader = await c.wait_leader()
        for i in range(20):
            await c.servers[leader].append([b"entry-%d" % i])
        await c.wait_converged()
        follower = c.servers[next(n for n in c.servers if n != leader)]
        follower.cpu_contention.available = True   # as on Linux, whatever this machine has
        checks: list[float] = []
        real = follower.store.find_damage

        def counted(start_index: int, max_bytes: int) -> tuple[int, int]:
            checks.append(asyncio.get_running_loop().time())
            return real(start_index, max_bytes)

        follower.store.find_damage = counted  # type: ignore[method-assign]
        verdict = [Verdict.GROW]
        monkeypatch.setattr(server_module, "should_yield", lambda *args: verdict[0])

        async def chunks_in(seconds: float) -> int:
            checks.clear()
            await asyncio.sleep(seconds)
            return len(checks)

        assert await chunks_in(1.5) >= 8
        verdict[0] = Verdict.YIELD
        await asyncio.sleep(0.3)                     # the tick already asleep ends
        assert await chunks_in(1.5) <= 2
    finally:
        await c.stop()
