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
                candidate_cluster_id: str = "", candidate_incarnation: int = 0,
                known_incarnation: int = 0) -> VoteDecision:
    """`known_incarnation`: the candidate's incarnation in this voter's
    configuration (raised when the member was moved to a new address);
    `candidate_incarnation`: the one the candidate knows itself by."""
    if candidate_id not in view.peer_ids:
        return VoteDecision(pb.REJECT_UNKNOWN_LEADER)
    if candidate_id == view.self_id:
        return VoteDecision(pb.REJECT_UNEXPECTED_LEADER)
    # An earlier incarnation: the process the member was moved away from,
    # still running (it was cut off when the move happened). The new server
    # under its id may vote in this term too: one id, two votes.
    if candidate_incarnation < known_incarnation:
        return VoteDecision(pb.REJECT_MOVED)
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


@dataclass(frozen=True)
class VoterState:
    """A voter as a vote round saw it (this node, or a peer's answer)."""
    id: str
    log_end: tuple[int, int]                 # (term, index) of its last entry
    repairing: bool = False
    # While repairing: the (term, index) of the log it had before losing
    # entries, which a candidate must reach; None: it lost its disk.
    floor: tuple[int, int] | None = None


def no_intact_leader(voters: list[str], states: list[VoterState]) -> str:
    """Why no reachable voter can be elected because voters lost committed
    entries (damaged on their disks, or a lost disk), or "" when one can (or
    nobody lost anything: then no leader is just an election or a partition).

    A repairing voter votes only for a candidate whose log reaches its floor,
    and cannot lead itself; a healthy voter may lead if its log reaches every
    floor. When no reachable healthy voter does, the entries up to the
    highest floor are held intact by no reachable node: the group refuses to
    serve rather than elect a leader without them (docs/log.md)."""
    seen = {s.id: s for s in states if s.id in voters}
    damaged = [s for s in seen.values() if s.repairing]
    if not damaged:
        return ""
    floors = [s.floor for s in damaged if s.floor is not None]
    highest = max(floors, default=None)
    healthy = [s for s in seen.values() if not s.repairing]
    if any(highest is None or s.log_end >= highest for s in healthy):
        return ""
    lost = ", ".join(f"{s.id} (up to entry {s.floor[1]}, term {s.floor[0]})" if s.floor else f"{s.id} (its disk)"
                     for s in sorted(damaged, key=lambda s: s.id))
    short = ", ".join(f"{s.id} ends at entry {s.log_end[1]}" for s in sorted(healthy, key=lambda s: s.id))
    unreachable = sorted(set(voters) - set(seen))
    what = f"entries up to {highest[1]} (term {highest[0]})" if highest else "the committed entries"
    return (f"no reachable voter holds {what} intact: {lost} lost entries (damaged or a lost disk) and repair"
            + (f"; {short}" if short else "")
            + (f"; unreachable: {', '.join(unreachable)}" if unreachable else "")
            + ". The group elects no leader, and so serves nothing, rather than lose committed entries: "
              "bring back a node that holds them, or restore one from a backup")
