"""The election's decisions as plain functions: may I grant this vote, and what
does this round of answers mean. No I/O and no clock, so every case is a unit test.

We follow Raft where DLedger deviates from it (a voter adopts a higher term at
once; the term is only raised after a successful pre-vote) and keep DLedger's
rejection reasons so that the answers read the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rpcgen import dledger_pb2 as pb

VoteResult = int  # a pb.VoteResult value


@dataclass(frozen=True)
class VoterView:
    """What a voter knows when a vote request arrives."""
    self_id: str
    peer_ids: frozenset[str]   # the voters of this node's current configuration
    term: int
    vote_for: str
    ledger_end_term: int
    ledger_end_index: int
    leader_alive: bool         # heard from a live leader of this term recently
    taking_leadership: bool    # this node is itself taking over by transfer
    cluster_id: str = ""       # the cluster's identity as this node knows it
    joined: bool = True        # False: lost its state and has not learned the identity yet
    cluster_seen: bool = False  # a peer named an identity while this node had none
    repairing: bool = False    # repairing its log (member_state.py)
    # While repairing: the (term, index) of the log it had before the cut; a
    # candidate must reach it. None while repairing: it grants no vote.
    repair_floor: tuple[int, int] | None = None
    voter: bool = True         # a voter of its current configuration (not a learner, joining or removed)


@dataclass(frozen=True)
class VoteDecision:
    result: VoteResult
    adopt_term: bool = False   # persist the candidate's higher term (no vote) first
    grant: bool = False        # persist the vote for the candidate, then answer ACCEPT

    @property
    def reason(self) -> str:
        return pb.VoteResult.Name(self.result)


def log_is_up_to_date(cand_end_term: int, cand_end_index: int, my_end_term: int, my_end_index: int) -> bool:
    return (cand_end_term, cand_end_index) >= (my_end_term, my_end_index)


def decide_vote(view: VoterView, candidate_id: str, term: int, ledger_end_term: int,
                ledger_end_index: int, pre_vote: bool, leadership_transfer: bool,
                candidate_cluster_id: str = "") -> VoteDecision:
    if candidate_id not in view.peer_ids:
        return VoteDecision(pb.REJECT_UNKNOWN_LEADER)
    if candidate_id == view.self_id:
        return VoteDecision(pb.REJECT_UNEXPECTED_LEADER)
    if view.cluster_id and candidate_cluster_id and view.cluster_id != candidate_cluster_id:
        return VoteDecision(pb.REJECT_OTHER_CLUSTER)
    # A node that repairs its log lacks entries it once acknowledged: judged
    # by the log it has now, its vote could elect a leader without them. It
    # judges by the log it had instead (repair_floor, below); without that
    # record (a node that lost its disk, which may also have voted in this
    # very term) it grants nothing and keeps its term.
    if view.repairing and view.repair_floor is None:
        return VoteDecision(pb.REJECT_REPAIRING)
    # A learner, a node still waiting to join and one that was removed have
    # no vote (membership.py); nor do they adopt the term.
    if not view.voter:
        return VoteDecision(pb.REJECT_NOT_VOTER)
    # A node that lost its state votes in a fresh cluster's first election
    # only: not once any node (the candidate or another peer) has named the
    # identity of a cluster that exists. Two wiped nodes of three would
    # otherwise found a second cluster beside the first.
    if not view.joined and (candidate_cluster_id or view.cluster_seen):
        return VoteDecision(pb.REJECT_NOT_JOINED)
    if term < view.term:
        return VoteDecision(pb.REJECT_EXPIRED_VOTE_TERM)
    # Leader stickiness: while we hear from a live leader we neither vote nor
    # adopt the term, so a node that comes back from a partition cannot unseat
    # a healthy leader. A handover from the leader itself is exempt.
    if view.leader_alive and not leadership_transfer:
        return VoteDecision(pb.REJECT_ALREADY_HAS_LEADER)
    if view.taking_leadership and not leadership_transfer:
        return VoteDecision(pb.REJECT_TAKING_LEADERSHIP)
    up_to_date = log_is_up_to_date(ledger_end_term, ledger_end_index,
                                   view.ledger_end_term, view.ledger_end_index)
    log_reject = (pb.REJECT_EXPIRED_LEDGER_TERM if ledger_end_term < view.ledger_end_term
                  else pb.REJECT_SMALL_LEDGER_END_INDEX)
    if up_to_date and view.repairing and view.repair_floor is not None:
        # Raft's election rule against the log this node had: the candidate
        # then holds every entry this node's acknowledgement helped commit.
        up_to_date = log_is_up_to_date(ledger_end_term, ledger_end_index, *view.repair_floor)
        log_reject = pb.REJECT_REPAIRING
    if pre_vote:
        # A pre-vote asks about term = candidate's term + 1 and changes nothing here.
        if term <= view.term:
            return VoteDecision(pb.REJECT_EXPIRED_VOTE_TERM)
        return VoteDecision(pb.ACCEPT if up_to_date else log_reject)
    adopt = term > view.term
    if not up_to_date:
        return VoteDecision(log_reject, adopt_term=adopt)
    vote_for = "" if adopt else view.vote_for
    if vote_for not in ("", candidate_id):
        return VoteDecision(pb.REJECT_ALREADY_VOTED, adopt_term=adopt)
    return VoteDecision(pb.ACCEPT, adopt_term=adopt, grant=True)


class ParseResult(str, Enum):
    """DLedger's names for what a round of vote answers means."""
    PASSED = "PASSED"                        # become leader
    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"        # try again after a random timeout
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"  # someone has a higher term: adopt it, then retry
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"


@dataclass(frozen=True)
class Tally:
    result: ParseResult
    accepted: int
    answered: int
    max_term: int
    bigger_ledger: int
    has_leader: int


def tally_votes(term: int, quorum: int, answers: list[tuple[int, int]]) -> Tally:
    """`answers` are (result, responder term) of the peers that answered; the
    candidate's own vote is counted here."""
    accepted = 1
    bigger_ledger = has_leader = 0
    max_term = term
    for result, their_term in answers:
        max_term = max(max_term, their_term)
        if result == pb.ACCEPT:
            accepted += 1
        elif result in (pb.REJECT_EXPIRED_LEDGER_TERM, pb.REJECT_SMALL_LEDGER_END_INDEX):
            bigger_ledger += 1
        elif result == pb.REJECT_ALREADY_HAS_LEADER:
            has_leader += 1
    if accepted >= quorum:
        outcome = ParseResult.PASSED
    elif max_term > term:
        outcome = ParseResult.WAIT_TO_VOTE_NEXT
    else:
        outcome = ParseResult.WAIT_TO_REVOTE
    return Tally(outcome, accepted, len(answers) + 1, max_term, bigger_ledger, has_leader)
