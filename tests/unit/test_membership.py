"""Membership changes online (dledger/membership.py): one server at a time,
learners promoted once caught up, removal (of the leader too), and changes
in flight across a leader change. In-memory cluster, real file stores."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from dledger.config import PeerAddress
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import Role
from dledger.membership import (LEARNER, VOTER, Member, Membership, learner_to_promote, plan_add, plan_move,
                                plan_remove)
from dledger.pusher.quorum import QuorumAckChecker
from dledger.vote_rules import VoterView, decide_vote
from rpcgen import dledger_pb2 as pb
from tests.unit.raft_harness import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


async def wait_for(condition, timeout: float = 5.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.01)


def members(c: Cluster, node: str) -> dict[str, str]:
    return {m.id: m.role for m in c.servers[node].membership.current.members}


async def add_node(c: Cluster, node: str) -> None:
    address = c.add_joining_node(node)
    await c.start(node)
    leader = await c.wait_leader()
    index, planned = await c.servers[leader].change_membership(pb.ADD_MEMBER, node, address)
    assert index > 0 and planned.get(node) == Member(node, address, LEARNER)


# ------------------------------------------------------------ pure decisions

def test_quorum_is_a_majority_of_voters_and_learners_do_not_count():
    five = Membership(tuple(Member(f"n{i}", f"h:{i + 1}") for i in range(5)))
    four = five.without("n4")
    assert (len(four.voters), four.quorum) == (4, 3)
    assert (len(five.voters), five.quorum) == (5, 3)
    with_learner = four.with_learner("n9", "h:99")
    assert with_learner.quorum == 3 and with_learner.learners == ["n9"]

    q = QuorumAckChecker("n0", with_learner.ids, with_learner.quorum)
    q.set_voters(with_learner.voters, with_learner.quorum)
    q.start_term(1)
    term_at = lambda index: 1  # noqa: E731
    for peer, mark in (("n0", 10), ("n1", 10), ("n9", 10)):
        q.update_watermark(1, peer, mark)
    # Three copies, but one is a learner's: 2 of 4 voters is no majority.
    assert q.compute_committed(1, -1, term_at) == -1
    q.update_watermark(1, "n2", 7)
    assert q.compute_committed(1, -1, term_at) == 7
    q.set_voters(five.voters, five.quorum)   # 5 voters: n0, n1, n2 reach 7
    assert q.compute_committed(1, -1, term_at) == 7


def test_change_rules_one_server_known_ids_and_the_last_voter():
    three = Membership(tuple(Member(f"n{i}", f"h:{i + 1}") for i in range(3)))
    assert plan_add(three, "n0", "h:1") is None                      # a retry: nothing to do
    with pytest.raises(DLedgerError) as e:
        plan_add(three, "n0", "h:9")
    assert e.value.code is ResponseCode.UNEXPECTED_MEMBER
    with pytest.raises(DLedgerError) as e:
        plan_add(three, "n3", "nonsense")
    assert e.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(DLedgerError) as e:
        plan_remove(three, "n7")
    assert e.value.code is ResponseCode.UNKNOWN_MEMBER
    one = Membership((Member("n0", "h:1"),))
    with pytest.raises(DLedgerError) as e:
        plan_remove(one, "n0")
    assert "last voter" in e.value.message
    added = plan_add(three, "n3", "h:4")
    assert added is not None and added.get("n3").role == LEARNER and added.quorum == 2
    assert learner_to_promote(added, lambda p: 50, 500, 400) is None          # far behind
    assert learner_to_promote(added, lambda p: 450, 500, 490) == "n3"         # within the gap
    assert Membership.from_json(added.to_json()) == added


def test_under_mutual_tls_an_added_server_needs_a_client_address_which_survives_promotion():
    three = Membership(tuple(Member(f"n{i}", f"h:{i + 1}") for i in range(3)))
    with pytest.raises(DLedgerError) as e:
        plan_add(three, "n3", "h:4", separate_client_port=True)
    assert e.value.code is ResponseCode.UNEXPECTED_ARGUMENT and "--client-address" in e.value.message
    with pytest.raises(DLedgerError) as e:
        plan_add(three, "n3", "h:4", "no port", separate_client_port=True)
    assert e.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    added = plan_add(three, "n3", "h:4", "c:4", separate_client_port=True)
    assert added is not None and added.client_address_of("n3") == "c:4" and added.client_address_of("n0") == ""
    assert plan_add(added, "n3", "h:4", "c:4", separate_client_port=True) is None   # a retry
    promoted = added.promoted("n3")
    assert promoted.get("n3") == Member("n3", "h:4", VOTER, "c:4")
    assert Membership.from_json(promoted.to_json()) == promoted
    # A configuration written before client addresses existed still reads.
    assert Membership.from_json(b'{"members":[{"id":"n0","address":"h:1","role":"voter"}]}').client_address_of("n0") == ""


def test_a_learner_or_non_member_never_votes():
    view = VoterView(self_id="n3", peer_ids=frozenset({"n0", "n1", "n2"}), term=3, vote_for="",
                     ledger_end_term=1, ledger_end_index=5, leader_alive=False, taking_leadership=False,
                     voter=False)
    assert decide_vote(view, "n0", 4, 3, 9, False, False).result == pb.REJECT_NOT_VOTER
    assert decide_vote(view, "n0", 4, 3, 9, True, False).result == pb.REJECT_NOT_VOTER
    # A candidate outside this voter's configuration gets no vote either.
    voter = VoterView(self_id="n1", peer_ids=frozenset({"n0", "n1", "n2"}), term=3, vote_for="",
                      ledger_end_term=1, ledger_end_index=5, leader_alive=False, taking_leadership=False)
    assert decide_vote(voter, "n3", 4, 3, 9, False, False).result == pb.REJECT_UNKNOWN_LEADER


# ------------------------------------------------------------------- cluster

async def test_an_added_server_is_a_learner_then_promoted_then_counts(cluster: Cluster):
    leader = await cluster.wait_leader()
    for i in range(30):
        await cluster.servers[leader].append([f"before-{i}".encode()])
    await add_node(cluster, "n3")
    # Promoted by the leader itself, with a second configuration entry.
    await wait_for(lambda: members(cluster, leader).get("n3") == VOTER, what="promotion")
    await wait_for(lambda: cluster.servers[leader].membership.pending_index < 0, what="promotion committed")
    await cluster.wait_converged()
    assert cluster.log_of("n3") == cluster.log_of(leader)
    for node in cluster.servers:
        assert members(cluster, node) == {"n0": VOTER, "n1": VOTER, "n2": VOTER, "n3": VOTER}
    # Four voters, quorum three: with one old follower down, the new server makes the majority.
    down = next(n for n in ("n0", "n1", "n2") if n != leader)
    await cluster.stop(down)
    await cluster.servers[leader].append([b"counted with n3"])
    await cluster.wait_converged()
    # ... and with two down there is no majority of four.
    other = next(n for n in ("n0", "n1", "n2") if n not in (leader, down))
    await cluster.stop(other)
    with pytest.raises(DLedgerError) as e:
        await cluster.servers[leader].append([b"no quorum"])
    assert e.value.code in (ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED)


async def test_a_joining_server_neither_campaigns_nor_votes_until_added(cluster: Cluster):
    await cluster.wait_leader()
    cluster.add_joining_node("n3")
    await cluster.start("n3")
    joining = cluster.servers["n3"]
    await asyncio.sleep(1.5)   # more than two election timeouts
    assert joining.member_state.term == 0 and joining.member_state.role is not Role.LEADER
    request = pb.VoteRequest(header=pb.Header(remote_id="n3", local_id="n0", term=9), ledger_end_index=99,
                             ledger_end_term=9)
    assert joining.handle_vote(request).result == pb.REJECT_NOT_VOTER


async def test_removing_a_follower_shrinks_the_quorum(cluster: Cluster):
    leader = await cluster.wait_leader()
    follower, other = [n for n in cluster.servers if n != leader]
    await cluster.servers[leader].append([b"x"])
    index, planned = await cluster.servers[leader].change_membership(pb.REMOVE_MEMBER, follower, "")
    assert index > 0 and planned.ids == sorted([leader, other])
    await cluster.stop(follower)
    assert cluster.servers[leader].elector.quorum == 2
    await cluster.servers[leader].append([b"two of two"])
    await cluster.wait_converged()
    assert members(cluster, other) == {leader: VOTER, other: VOTER}
    with pytest.raises(DLedgerError) as e:
        await cluster.servers[leader].change_membership(pb.REMOVE_MEMBER, follower, "")
    assert e.value.code is ResponseCode.UNKNOWN_MEMBER


async def test_a_leader_that_removes_itself_steps_down_once_committed(cluster: Cluster):
    old = await cluster.wait_leader()
    await cluster.servers[old].append([b"x"])
    await cluster.servers[old].change_membership(pb.REMOVE_MEMBER, old, "")
    await wait_for(lambda: not cluster.servers[old].member_state.is_leader, what="step down")
    rest = [n for n in cluster.servers if n != old]
    new = await cluster.wait_leader(among=rest)
    assert new != old
    await cluster.servers[new].append([b"after"])
    await cluster.wait_converged(nodes=rest)
    assert members(cluster, new) == {n: VOTER for n in rest}
    # The removed server never campaigns again.
    term = cluster.servers[old].member_state.term
    await asyncio.sleep(1.0)
    assert cluster.servers[old].member_state.term == term
    assert cluster.servers[old].member_state.role is not Role.LEADER


async def test_a_second_change_is_refused_while_one_is_uncommitted(cluster: Cluster):
    leader = await cluster.wait_leader()
    for node in cluster.servers:
        if node != leader:
            cluster.network.cut |= {(leader, node), (node, leader)}
    first = asyncio.ensure_future(cluster.servers[leader].change_membership(pb.ADD_MEMBER, "n3", "127.0.0.1:30003"))
    await asyncio.sleep(0.05)
    assert cluster.servers[leader].membership.pending_index > 0
    with pytest.raises(DLedgerError) as e:
        await cluster.servers[leader].change_membership(pb.ADD_MEMBER, "n4", "127.0.0.1:30004")
    assert e.value.code is ResponseCode.MEMBERSHIP_CHANGE_IN_PROGRESS
    cluster.network.heal()
    await first
    await cluster.wait_converged()


async def test_an_uncommitted_change_is_reverted_everywhere_when_truncated(cluster: Cluster):
    old = await cluster.wait_leader()
    before = cluster.servers[old].membership.current
    cluster.network.isolate(old)
    change = asyncio.ensure_future(cluster.servers[old].change_membership(pb.ADD_MEMBER, "n3", "127.0.0.1:30003"))
    await asyncio.sleep(0.05)
    # In effect on the old leader from the moment it was appended ...
    assert "n3" in cluster.servers[old].membership.current.ids
    rest = [n for n in cluster.servers if n != old]
    new = await cluster.wait_leader(among=rest, timeout=8.0)
    await cluster.servers[new].append([b"new term"])
    with pytest.raises(DLedgerError):
        await change
    cluster.network.heal()
    await cluster.wait_converged(timeout=8.0)
    # ... and gone with the entry the new leader's log cut away.
    for node in cluster.servers:
        assert cluster.servers[node].membership.current == before, node
    assert cluster.log_of(old) == cluster.log_of(new)


async def test_a_change_held_by_the_new_leader_survives_a_leader_change(cluster: Cluster):
    old = await cluster.wait_leader()
    keeper, lagging = [n for n in cluster.servers if n != old]
    # Only `keeper` receives the entry: it cannot commit (n3 is a learner, the
    # quorum is 2 of 3 voters, but the leader's answer from keeper is cut).
    cluster.network.cut |= {(old, lagging), (keeper, old)}
    change = asyncio.ensure_future(cluster.servers[old].change_membership(pb.REMOVE_MEMBER, lagging, ""))
    await wait_for(lambda: lagging not in cluster.servers[keeper].membership.current.ids, what="keeper has it")
    await cluster.stop(old)
    with pytest.raises(DLedgerError):
        await change
    cluster.network.heal()
    # keeper's configuration is {old, keeper}: it needs old's vote, which is
    # gone; lagging still counts 3 voters and votes for keeper (longer log).
    await cluster.start(old)
    new = await cluster.wait_leader(timeout=10.0)
    await cluster.servers[new].append([b"after"])
    nodes = [old, keeper]
    await cluster.wait_converged(nodes=nodes, timeout=8.0)
    for node in nodes:
        assert members(cluster, node) == {old: VOTER, keeper: VOTER}
        assert cluster.servers[node].membership.pending_index < 0


async def test_membership_survives_a_restart(cluster: Cluster):
    leader = await cluster.wait_leader()
    await add_node(cluster, "n3")
    await wait_for(lambda: members(cluster, leader).get("n3") == VOTER
                   and cluster.servers[leader].membership.pending_index < 0, what="promotion")
    await cluster.wait_converged()
    follower = next(n for n in ("n0", "n1", "n2") if n != leader)
    await cluster.servers[leader].change_membership(pb.REMOVE_MEMBER, follower, "")
    await cluster.stop(follower)
    await cluster.wait_converged()
    for node in list(cluster.servers):
        await cluster.stop(node)
        await cluster.start(node)
    assert members(cluster, "n3") == {n: VOTER for n in ("n0", "n1", "n2", "n3") if n != follower}
    leader = await cluster.wait_leader(timeout=8.0)
    await cluster.servers[leader].append([b"after restart"])
    await cluster.wait_converged()


async def test_a_follower_reset_past_configuration_entries_gets_the_leaders_configuration(cluster: Cluster):
    import time
    leader = await cluster.wait_leader()
    away = next(n for n in cluster.servers if n != leader)
    await cluster.stop(away)
    await add_node(cluster, "n3")       # while `away` is down: it never sees these entries
    await wait_for(lambda: members(cluster, leader).get("n3") == VOTER
                   and cluster.servers[leader].membership.pending_index < 0, what="promotion")
    for i in range(200):
        await cluster.servers[leader].append([b"x" * 1000])
    store = cluster.servers[leader].store
    config_index = cluster.servers[leader].membership.committed_index
    deleted = store.delete_expired(keep_from_index=store.ledger_end_index - 10, older_than_wall_s=time.time() + 60)
    assert deleted and store.ledger_begin_index > config_index, (deleted, store.ledger_begin_index, config_index)
    await cluster.start(away)
    await cluster.wait_converged(timeout=8.0)
    assert members(cluster, away) == {"n0": VOTER, "n1": VOTER, "n2": VOTER, "n3": VOTER}
    assert cluster.servers[away].store.ledger_begin_index == store.ledger_begin_index


async def test_a_server_removed_and_added_again_with_an_empty_disk_is_not_promoted_on_its_old_progress(
        cluster: Cluster):
    leader = await cluster.wait_leader()
    await add_node(cluster, "n3")
    await wait_for(lambda: members(cluster, leader).get("n3") == VOTER, what="promotion")
    for i in range(20):
        await cluster.servers[leader].append([f"e{i}".encode()])
    await cluster.wait_converged()
    term = cluster.servers[leader].member_state.term
    assert cluster.servers[leader].pusher.quorum.watermark(term, "n3") > 10
    await cluster.servers[leader].change_membership(pb.REMOVE_MEMBER, "n3", "")
    await cluster.stop("n3")
    shutil.rmtree(cluster.configs["n3"].data_dir)
    # Added again (same id and address, a new empty disk) in the same term,
    # and not reachable yet: it holds nothing, so it must stay a learner
    # (its acknowledgements from before the removal count for nothing).
    address = cluster.add_joining_node("n3")
    await cluster.servers[leader].change_membership(pb.ADD_MEMBER, "n3", address)
    await asyncio.sleep(0.5)
    assert cluster.servers[leader].member_state.term == term
    assert members(cluster, leader)["n3"] == LEARNER
    assert cluster.servers[leader].pusher.quorum.watermark(term, "n3") == -1
    await cluster.start("n3")
    await wait_for(lambda: members(cluster, leader).get("n3") == VOTER, what="promotion once caught up")
    await cluster.wait_converged()


def test_move_rules_same_id_new_address_only_once_silent_and_never_the_leader():
    three = Membership(tuple(Member(f"n{i}", f"h:{i + 1}") for i in range(3)))
    moved = plan_move(three, "n1", "h:9", "n0", heard_from_s=5.0, silent_needed_s=2.0)
    assert moved.get("n1") == Member("n1", "h:9", VOTER, incarnation=1)
    assert moved.voters == three.voters and Membership.from_json(moved.to_json()) == moved
    assert plan_move(moved, "n1", "h:9", "n0", 5.0, 2.0) is None                 # a retry: nothing to do
    for args, code in ((("n1", "h:9", "n0", 0.3, 2.0), ResponseCode.ILLEGAL_MEMBER_STATE),  # still answers
                       (("n0", "h:9", "n0", 9.0, 2.0), ResponseCode.UNEXPECTED_MEMBER),   # the leader itself
                       (("n1", "h:3", "n0", 9.0, 2.0), ResponseCode.UNEXPECTED_MEMBER),   # n2's address
                       (("n7", "h:9", "n0", 9.0, 2.0), ResponseCode.UNKNOWN_MEMBER),
                       (("n1", "nowhere", "n0", 9.0, 2.0), ResponseCode.UNEXPECTED_ARGUMENT)):
        with pytest.raises(DLedgerError) as e:
            plan_move(three, *args)
        assert e.value.code is code, args
    # Under mutual TLS clients cannot use the peer port: the new client
    # address is required, kept by the move, and a retry is still a no-op.
    with pytest.raises(DLedgerError) as e:
        plan_move(three, "n1", "h:9", "n0", 5.0, 2.0, separate_client_port=True)
    assert e.value.code is ResponseCode.UNEXPECTED_ARGUMENT and "--client-address" in e.value.message
    secure = plan_move(three, "n1", "h:9", "n0", 5.0, 2.0, client_address="c:9", separate_client_port=True)
    assert secure.get("n1") == Member("n1", "h:9", VOTER, "c:9", incarnation=1)
    assert secure.client_address_of("n1") == "c:9" and Membership.from_json(secure.to_json()) == secure
    assert plan_move(secure, "n1", "h:9", "n0", 5.0, 2.0, client_address="c:9") is None
    assert plan_move(secure, "n1", "h:9", "n0", 5.0, 2.0) is None     # no client address given: the one it has
    assert plan_move(secure, "n1", "h:8", "n0", 5.0, 2.0).get("n1").client_address == "c:9"
    # An earlier incarnation of a moved member gets no vote (the old process,
    # if it still runs): the new server under its id may vote in this term too.
    view = VoterView(self_id="n0", peer_ids=frozenset({"n0", "n1", "n2"}), term=3, vote_for="",
                     ledger_end_term=1, ledger_end_index=5, leader_alive=False, taking_leadership=False)
    assert decide_vote(view, "n1", 4, 3, 9, False, False, candidate_incarnation=0,
                       known_incarnation=1).result == pb.REJECT_MOVED
    assert decide_vote(view, "n1", 4, 3, 9, False, False, candidate_incarnation=1,
                       known_incarnation=1).result == pb.ACCEPT


async def test_a_dead_member_moved_to_a_new_address_with_an_empty_disk_counts_once_caught_up(cluster: Cluster):
    leader = await cluster.wait_leader()
    moving, other = [n for n in cluster.servers if n != leader]
    for i in range(20):
        await cluster.servers[leader].append([f"e{i}".encode()])
    await cluster.wait_converged()
    with pytest.raises(DLedgerError) as e:      # it is alive: refused
        await cluster.servers[leader].change_membership(pb.MOVE_MEMBER, moving, "127.0.0.1:31001")
    assert e.value.code is ResponseCode.ILLEGAL_MEMBER_STATE and "still answers" in e.value.message
    await cluster.stop(moving)
    shutil.rmtree(cluster.configs[moving].data_dir)         # its machine is gone
    await asyncio.sleep(2 * cluster.settings["election_timeout_max_s"] + 0.1)
    index, planned = await cluster.servers[leader].change_membership(pb.MOVE_MEMBER, moving, "127.0.0.1:31001")
    assert index > 0 and planned.get(moving) == Member(moving, "127.0.0.1:31001", VOTER, incarnation=1)
    term = cluster.servers[leader].member_state.term
    assert cluster.servers[leader].pusher.quorum.watermark(term, moving) == -1   # nothing counts yet
    # The old process, were it still running, campaigns as incarnation 0: refused.
    stale = pb.VoteRequest(header=pb.Header(remote_id=other, local_id=moving, term=term + 5),
                           ledger_end_index=10**6, ledger_end_term=10**6)
    assert cluster.servers[other].handle_vote(stale).result == pb.REJECT_MOVED
    # The new server: same id, new address, an empty disk, started with --join.
    cluster.reconfigure(moving, join=True)
    await cluster.start(moving)
    new = cluster.servers[moving]
    await wait_for(lambda: not new.member_state.repairing and new.member_state.joined, what="it catches up")
    await cluster.wait_converged()
    assert members(cluster, moving) == members(cluster, leader)
    # It counts: with the third voter down, the leader and the new server commit.
    await cluster.stop(other)
    await cluster.servers[leader].append([b"counted with the moved member"])
    assert cluster.log_of(moving)[-1][2] == b"counted with the moved member"


async def test_a_node_restarted_with_other_peers_keeps_the_configuration_it_started_with(cluster: Cluster, caplog):
    """--peers only starts a group: with no change ever committed, a node
    restarted with other --peers (here naming n0 at another address) still
    holds the configuration it started with, and says so. Before, it took
    the new --peers for the group's configuration, and nodes could disagree
    on who the members are."""
    leader = await cluster.wait_leader()
    await cluster.servers[leader].append([b"before"])
    await cluster.wait_converged()
    node = next(n for n in cluster.servers if n not in (leader, "n0"))
    started_with = cluster.servers[node].membership.current
    await cluster.stop(node)
    moved = tuple(PeerAddress(p.id, p.host, 31999) if p.id == "n0" else p
                  for p in cluster.configs[node].peers)
    cluster.reconfigure(node, peers=moved)
    await cluster.start(node)
    restarted = cluster.servers[node].membership
    assert restarted.current == started_with
    assert restarted.address_of("n0") == started_with.address_of("n0") != "127.0.0.1:31999"
    assert "is not the configuration this node started with" in caplog.text
    leader = await cluster.wait_leader()
    await cluster.servers[leader].append([b"after"])
    await cluster.wait_converged()
