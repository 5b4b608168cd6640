"""The election's decisions, without sockets or clocks."""
from __future__ import annotations

from dataclasses import replace

from dledger.vote_rules import ParseResult, VoterView, decide_vote, tally_votes
from rpcgen import dledger_pb2 as pb

VIEW = VoterView(self_id="n0", peer_ids=frozenset({"n0", "n1", "n2"}), term=5, vote_for="",
                 ledger_end_term=5, ledger_end_index=10, leader_alive=False, taking_leadership=False)


def vote(view: VoterView = VIEW, candidate: str = "n1", term: int = 6, end_term: int = 5, end_index: int = 10,
         pre_vote: bool = False, transfer: bool = False):
    return decide_vote(view, candidate, term, end_term, end_index, pre_vote, transfer)


def test_grants_vote_to_up_to_date_candidate_in_higher_term_and_adopts_term():
    d = vote()
    assert (d.result, d.adopt_term, d.grant) == (pb.ACCEPT, True, True)


def test_rejects_unknown_and_self_candidates():
    assert vote(candidate="n9").result == pb.REJECT_UNKNOWN_LEADER
    assert vote(candidate="n0").result == pb.REJECT_UNEXPECTED_LEADER


def test_rejects_expired_term():
    assert vote(term=4).result == pb.REJECT_EXPIRED_VOTE_TERM


def test_rejects_candidate_with_older_last_term_even_if_longer():
    d = vote(end_term=4, end_index=100)
    assert d.result == pb.REJECT_EXPIRED_LEDGER_TERM and not d.grant
    # The higher term is still adopted (Raft), but no vote is given.
    assert d.adopt_term


def test_rejects_candidate_with_shorter_log_in_same_term():
    assert vote(end_index=9).result == pb.REJECT_SMALL_LEDGER_END_INDEX


def test_only_one_vote_per_term():
    voted = replace(VIEW, term=6, vote_for="n2")
    assert vote(voted, candidate="n1", term=6).result == pb.REJECT_ALREADY_VOTED
    # Asking again for the same candidate is idempotent.
    assert vote(voted, candidate="n2", term=6).result == pb.ACCEPT
    # A higher term forgets the old vote.
    assert vote(voted, candidate="n1", term=7).result == pb.ACCEPT


def test_live_leader_makes_voter_refuse_and_keep_its_term():
    alive = replace(VIEW, leader_alive=True)
    d = vote(alive, term=9)
    assert d.result == pb.REJECT_ALREADY_HAS_LEADER and not d.adopt_term and not d.grant


def test_leadership_transfer_overrides_leader_stickiness():
    alive = replace(VIEW, leader_alive=True)
    assert vote(alive, transfer=True).result == pb.ACCEPT


def test_pre_vote_changes_nothing():
    d = vote(pre_vote=True)
    assert d.result == pb.ACCEPT and not d.adopt_term and not d.grant
    assert vote(pre_vote=True, term=5).result == pb.REJECT_EXPIRED_VOTE_TERM
    assert vote(pre_vote=True, end_index=3).result == pb.REJECT_SMALL_LEDGER_END_INDEX
    assert vote(replace(VIEW, leader_alive=True), pre_vote=True).result == pb.REJECT_ALREADY_HAS_LEADER


def test_split_vote_waits_to_revote():
    # 5 nodes, quorum 3: self + 1 accept, two others voted elsewhere.
    t = tally_votes(6, 3, [(pb.ACCEPT, 6), (pb.REJECT_ALREADY_VOTED, 6), (pb.REJECT_ALREADY_VOTED, 6)])
    assert t.result is ParseResult.WAIT_TO_REVOTE and t.accepted == 2


def test_tally_passes_with_quorum_and_sees_higher_terms():
    assert tally_votes(6, 2, [(pb.ACCEPT, 6)]).result is ParseResult.PASSED
    t = tally_votes(6, 2, [(pb.REJECT_EXPIRED_VOTE_TERM, 9)])
    assert t.result is ParseResult.WAIT_TO_VOTE_NEXT and t.max_term == 9
    # Nobody answered (a partition): no quorum, no term change.
    assert tally_votes(6, 2, []).result is ParseResult.WAIT_TO_REVOTE
