"""MemberState: role, term, vote and leader of this node — the only place that changes them.

The term and the vote live in `<data_dir>/dledger-<id>/currterm` (Java properties,
keys currTerm and voteLeader, as in DLedger). They are written and fsynced
*before* the change becomes visible, so a vote is never granted twice in a term
even across a crash. The write is done inline on the event loop on purpose: it
happens only on term changes and votes (a handful per failover), and doing it
inline makes "persist, then answer" atomic with respect to every other handler.

Two more keys are ours, for a disk that lies, fails or is replaced:
- clusterId: the cluster's identity, made by its first leader and learned by
  every node from the leader's messages. A node that starts without a
  `currterm` (a new node, or one whose disk was wiped or replaced) cannot
  know whether it voted in a term before, so it grants no vote to a
  candidate of an existing cluster until it has learned the identity from a
  leader and caught up (a fresh cluster's nodes, none with an identity yet,
  elect their first leader as usual). Nodes of older versions, with a
  `currterm` but no identity, vote as before.
- repairUntil: >= 0 while the node repairs its log: it found a damaged entry
  below what it had acknowledged (or lost its disk), cut its log there, and
  neither campaigns nor counts toward a quorum until it holds entries up to
  this index again, fetched and CRC-checked from the leader.
- repairTerm: the term of the last entry the node held before the cut. While
  repairing, it votes only for a candidate whose log is at least as up to
  date as (repairTerm, repairUntil), the log it had (vote_rules.py): that is
  Raft's own election rule applied to what the node acknowledged, so its
  vote cannot elect a leader without an entry it helped commit, and two
  damaged nodes of three can still elect the healthy one and repair. A node
  that lost its disk has no such record (and may have voted in this term):
  it grants no vote until repaired.
"""
from __future__ import annotations

import errno
import logging
import os
import uuid
from enum import Enum
from typing import Callable

from dledger.clock import Clock
from dledger.config import DLedgerConfig
from dledger.errors import DLedgerError, ResponseCode
from dledger.store.properties import read_properties, write_properties

log = logging.getLogger(__name__)


class Role(str, Enum):
    CANDIDATE = "CANDIDATE"
    FOLLOWER = "FOLLOWER"
    LEADER = "LEADER"


RoleListener = Callable[[Role, int], None]


class MemberState:
    def __init__(self, config: DLedgerConfig, clock: Clock) -> None:
        self.config = config
        self.self_id = config.self_id
        self.clock = clock
        self.role = Role.CANDIDATE  # DLedger starts every node as a candidate
        self.term = 0
        self.vote_for = ""
        self.leader_id = ""
        self.committed_index = -1
        # When this node last heard from a leader of its current term.
        self.last_leader_contact = float("-inf")
        # Set on the leader while a leadership transfer is under way.
        self.transferee = ""
        # Set on a transferee while it takes leadership in this term.
        self.term_to_take_leadership = -1
        self._listeners: list[RoleListener] = []
        self._path = os.path.join(config.data_dir, f"dledger-{config.self_id}", "currterm")
        self.cluster_id = ""
        self.repair_until = -1
        self.repair_term = -1
        # Started without a currterm: this node may have lost votes it gave.
        # Persisted (lostState) until it has joined and caught up, so that a
        # restart in between does not make it a voter of its own.
        self.lost_state = False
        # A peer named a cluster identity while this node had none: a node
        # that lost its state must then join that cluster, not found one.
        self.cluster_seen = False
        # Where clients reach a node; the server replaces it with one that
        # knows the members added since start-up (dledger/membership.py).
        self.client_address_of: Callable[[str], str] = config.client_address_of

    # ---------------------------------------------------------- persistence
    def load(self) -> None:
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        if not os.path.exists(self._path):
            self.lost_state = True
            log.info("no %s: a new node, or one that lost its disk; it votes once it has joined "
                     "(learned the cluster's identity from a leader and caught up)", self._path)
            return
        values = read_properties(self._path)
        self.term = int(values.get("currTerm", "0") or 0)
        self.vote_for = values.get("voteLeader", "")
        self.cluster_id = values.get("clusterId", "")
        self.repair_until = int(values.get("repairUntil", "-1") or -1)
        self.repair_term = int(values.get("repairTerm", "-1") or -1)
        self.lost_state = values.get("lostState", "") == "true"
        log.info("loaded term %d vote %r cluster %r%s", self.term, self.vote_for, self.cluster_id,
                 f", repairing up to {self.repair_until}" if self.repairing else "")

    @property
    def repairing(self) -> bool:
        return self.repair_until >= 0

    @property
    def repair_floor(self) -> tuple[int, int] | None:
        """While repairing: the (term, index) of the log this node had, which a
        candidate's log must reach for its vote; None when it grants none."""
        if not self.repairing or self.repair_term < 0:
            return None
        return self.repair_term, self.repair_until

    @property
    def joined(self) -> bool:
        """May grant votes to a candidate of a cluster with an identity."""
        return not self.lost_state or bool(self.cluster_id)

    def learn_cluster(self, cluster_id: str, leader_committed: int) -> None:
        """A leader's message named the cluster: a node that lost its state
        joins it as a non-voter until it holds what the leader had committed."""
        if self.cluster_id or not cluster_id:
            return
        repair_until = max(self.repair_until, leader_committed) if self.lost_state else self.repair_until
        if repair_until < 0:
            self.lost_state = False   # nothing committed to catch up with: it is whole
        self._persist(self.term, self.vote_for, cluster_id=cluster_id, repair_until=repair_until)
        log.info("joined cluster %s%s", cluster_id,
                 f"; a non-voter until it holds entries up to {repair_until}" if repair_until >= 0 else "")

    def found_cluster(self) -> None:
        """The first leader of a cluster without an identity gives it one."""
        if not self.cluster_id:
            self.lost_state = False   # a fresh cluster's first leader: nothing was lost
            self._persist(self.term, self.vote_for, cluster_id=uuid.uuid4().hex)
            log.info("cluster identity %s created", self.cluster_id)

    def start_repair(self, until: int, last_term: int) -> None:
        """`until`, `last_term`: the index and term of the last entry this node
        held before the cut. A second damage during a repair raises both, so
        the floor stays at or above every log it had. The term is capped at
        the current one, which no entry's term exceeds."""
        term = min(max(last_term, self.repair_term), self.term) if last_term >= 0 else -1
        self._persist(self.term, self.vote_for, repair_until=max(until, self.repair_until, 0), repair_term=term)

    def finish_repair(self) -> None:
        self.lost_state = False   # joined (a repair starts only once it has) and caught up
        self._persist(self.term, self.vote_for, repair_until=-1, repair_term=-1)

    def see_cluster(self, cluster_id: str) -> None:
        """A peer's message named a cluster identity."""
        if cluster_id and not self.cluster_id and not self.cluster_seen:
            self.cluster_seen = True
            if self.lost_state:
                log.info("a peer belongs to cluster %s: this node lost its state, so it waits for that "
                         "cluster's leader to join it (it neither campaigns nor votes until then)", cluster_id)

    def _persist(self, term: int, vote_for: str, cluster_id: str | None = None,
                 repair_until: int | None = None, repair_term: int | None = None) -> None:
        cluster_id = self.cluster_id if cluster_id is None else cluster_id
        repair_until = self.repair_until if repair_until is None else repair_until
        repair_term = self.repair_term if repair_term is None else repair_term
        values = {"currTerm": str(term), "voteLeader": vote_for}
        if cluster_id:
            values["clusterId"] = cluster_id
        if repair_until >= 0:
            values["repairUntil"] = str(repair_until)
            if repair_term >= 0:
                values["repairTerm"] = str(repair_term)
        if self.lost_state:
            values["lostState"] = "true"
        try:
            write_properties(self._path, values)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                # Not persisted, so not taken: no term moves and no vote is
                # granted until the disk has room (the Raft rule).
                raise DLedgerError(ResponseCode.DISK_FULL,
                                   f"cannot persist term {term} in {self._path}: {error.strerror}") from error
            raise
        self.term = term
        self.vote_for = vote_for
        self.cluster_id = cluster_id
        self.repair_until = repair_until
        self.repair_term = repair_term if repair_until >= 0 else -1

    # ------------------------------------------------------------- queries
    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def leader_address(self) -> str:
        return self.client_address_of(self.leader_id) if self.leader_id else ""

    def leader_is_alive(self) -> bool:
        """True while a leader of this term was heard within the minimum election
        timeout: votes for others are then refused (leader stickiness)."""
        if self.role is Role.LEADER:
            return True
        if not self.leader_id:
            return False
        return self.clock.now() - self.last_leader_contact < self.config.election_timeout_min_s

    def add_listener(self, listener: RoleListener) -> None:
        self._listeners.append(listener)

    # --------------------------------------------------------- transitions
    def adopt_term(self, term: int) -> None:
        """A message carried a higher term: take it, forget the vote, follow nobody yet."""
        assert term > self.term, (term, self.term)
        self._persist(term, "")
        self.leader_id = ""
        self.transferee = ""
        # The follower's election timer starts afresh in the new term.
        self.last_leader_contact = self.clock.now()
        self._set_role(Role.FOLLOWER)

    def vote(self, candidate_id: str) -> None:
        self._persist(self.term, candidate_id)

    def start_campaign(self) -> int:
        """Next term, vote for self (persisted), stay candidate. Returns the new term."""
        self._persist(self.term + 1, self.self_id)
        self.leader_id = ""
        self._set_role(Role.CANDIDATE)
        return self.term

    def change_to_leader(self, term: int) -> None:
        assert term == self.term and self.role is Role.CANDIDATE
        self.leader_id = self.self_id
        self.transferee = ""
        self.term_to_take_leadership = -1
        self._set_role(Role.LEADER)

    def change_to_follower(self, leader_id: str) -> None:
        self.leader_id = leader_id
        self.transferee = ""
        self.last_leader_contact = self.clock.now()
        self._set_role(Role.FOLLOWER)

    def change_to_candidate(self) -> None:
        """Lost the leader (or, as leader, the quorum): campaign in due course."""
        self.leader_id = ""
        self.transferee = ""
        self._set_role(Role.CANDIDATE)

    def touch_leader(self) -> None:
        self.last_leader_contact = self.clock.now()

    def _set_role(self, role: Role) -> None:
        old = self.role
        self.role = role
        if old is not role:
            log.info("role %s -> %s in term %d (leader %r)", old.value, role.value, self.term, self.leader_id)
        for listener in self._listeners:
            listener(role, self.term)
