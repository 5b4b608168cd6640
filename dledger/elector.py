"""DLedgerLeaderElector: the election loop, heartbeats and leadership transfer.

One task maintains the node in its role:
- LEADER: heartbeats every `heartbeat_interval_s`; steps down (to CANDIDATE)
  when no quorum answered for `election_timeout_max_s` (check-quorum), so a
  leader cut off from the group stops serving; hands over to the preferred
  leader when one is configured and caught up.
- FOLLOWER: becomes CANDIDATE when no leader was heard for a randomized
  election timeout.
- CANDIDATE: pre-vote at term+1 (nobody changes state); only if a quorum
  would vote, raise the term, vote for itself (persisted) and ask for votes.

The decisions are in vote_rules.py; this module waits, sends and applies them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import logging
import random
from typing import Callable

from dledger.clock import Clock
from dledger.config import DLedgerConfig
from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import MemberState, Role
from dledger.membership import MembershipLog
from dledger.read_index import ReadIndex
from dledger.status import ServerObserver
from dledger.transport import Transport, TransportError
from dledger.vote_rules import ParseResult, VoterState, VoterView, decide_vote, no_intact_leader, tally_votes
from dledger.waiting import wait_event
from rpcgen import dledger_pb2 as pb

if TYPE_CHECKING:
    from dledger.store.file_store import DLedgerFileStore

log = logging.getLogger(__name__)

# A transferee polls its own progress this often while taking leadership.
TRANSFER_POLL_S = 0.01
# Clients are refused with NO_INTACT_COPY while the vote round that found
# it is at most this many (maximum) election timeouts old.
NO_INTACT_FRESH_TIMEOUTS = 3


class DLedgerLeaderElector:
    def __init__(self, config: DLedgerConfig, member_state: MemberState, store: DLedgerFileStore,
                 transport: Transport, clock: Clock, observer: ServerObserver,
                 peer_watermark: Callable[[str], int], on_leader_commit: Callable[[int], None],
                 membership: MembershipLog, rng: random.Random | None = None) -> None:
        self.config = config
        self.member_state = member_state
        self.store = store
        self.transport = transport
        self.clock = clock
        self.observer = observer
        self.peer_watermark = peer_watermark
        self.on_leader_commit = on_leader_commit
        self.rng = rng or random.Random()
        self.membership = membership
        self.wakeup = asyncio.Event()
        self.next_vote_at = clock.now() + self._election_timeout()
        self.election_timeout = self._election_timeout()
        self.next_heartbeat_at = 0.0
        self.last_contact: dict[str, float] = {}
        self.leader_since = 0.0
        self.next_preferred_check_at = 0.0
        # Why this node must not lead now (DLedgerServer.leadership_vetoes).
        self.vetoes: list[Callable[[], str]] = []
        self._heartbeats: set[asyncio.Task[bool]] = set()
        # What the last vote round learned of the voters that answered, and
        # whether lost entries keep every reachable voter from leading.
        self._round_states: list[VoterState] = []
        self.no_intact_reason = ""
        self.no_intact_at = float("-inf")
        self.read_index = ReadIndex(member_state, lambda: self.voter_peers, self._acks_needed, self._heartbeat,
                                    config.rpc_timeout_s)
        member_state.add_listener(self._on_role_change)

    # ----------------------------------------------------------- membership
    @property
    def peers(self) -> list[str]:
        """Everyone this node heartbeats as leader (learners, and a server
        whose removal is not committed yet, included)."""
        return self.membership.replication_targets()

    @property
    def voter_peers(self) -> list[str]:
        """The other voters of the current configuration: votes are asked from
        them, and only they count toward a quorum."""
        return [v for v in self.membership.current.voters if v != self.config.self_id]

    @property
    def quorum(self) -> int:
        return self.membership.current.quorum

    @property
    def is_voter(self) -> bool:
        return self.membership.current.is_voter(self.config.self_id)

    def _acks_needed(self) -> int:
        """Answers a leader needs from other voters for a majority (it counts
        itself only while it is a voter: a leader removing itself does not)."""
        return self.quorum - (1 if self.is_voter else 0)

    def _election_timeout(self) -> float:
        return self.rng.uniform(self.config.election_timeout_min_s, self.config.election_timeout_max_s)

    def _on_role_change(self, role: Role, term: int) -> None:
        now = self.clock.now()
        if role is Role.LEADER:
            self.leader_since = now
            self.last_contact = {}
            self.next_heartbeat_at = now
            self.next_preferred_check_at = now + self.config.preferred_leader_check_interval_s
        elif role is Role.FOLLOWER:
            self.election_timeout = self._election_timeout()
        self.wakeup.set()
        self.observer.on_role_change(role.value, term)

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        while True:
            try:
                wait = await self._maintain()
            except DLedgerError as error:
                if error.code is not ResponseCode.DISK_FULL:
                    raise
                # The term could not be persisted: try again an election timeout later.
                log.warning("%s", error)
                self.next_vote_at = self.clock.now() + self._election_timeout()
                wait = self.next_vote_at - self.clock.now()
            if wait > 0:
                await wait_event(self.wakeup, wait)
            self.wakeup.clear()

    async def _maintain(self) -> float:
        role = self.member_state.role
        if role is Role.LEADER:
            return self._maintain_as_leader()
        if role is Role.FOLLOWER:
            return self._maintain_as_follower()
        return await self._maintain_as_candidate()

    def _maintain_as_follower(self) -> float:
        ms, now = self.member_state, self.clock.now()
        silent_for = now - ms.last_leader_contact
        if silent_for >= self.election_timeout and not self.is_voter:
            # A learner (or a node not, or no longer, a member) never campaigns.
            return self.election_timeout
        if silent_for >= self.election_timeout:
            log.info("no leader heard for %.0f ms in term %d: becoming candidate", silent_for * 1000, ms.term)
            ms.change_to_candidate()
            self.next_vote_at = now
            return 0.0
        return self.election_timeout - silent_for

    def _maintain_as_leader(self) -> float:
        ms, now, config = self.member_state, self.clock.now(), self.config
        if self._quorum_silent_for(now) > config.election_timeout_max_s:
            log.warning("no quorum answered for %.0f ms: stepping down in term %d",
                        self._quorum_silent_for(now) * 1000, ms.term)
            ms.change_to_candidate()
            self.next_vote_at = now + self._election_timeout()
            return 0.0
        reason = self.store.read_only_reason or self._vetoed()
        if reason:
            # A leader that cannot write commits nothing (or whose state
            # machine stopped answers nothing), and its heartbeats would keep
            # the followers, who can, from electing one that does.
            log.warning("stepping down in term %d: %s", ms.term, reason)
            ms.change_to_candidate()
            self.next_vote_at = now + self._election_timeout()
            return 0.0
        if now >= self.next_heartbeat_at:
            self._send_heartbeats()
            self.next_heartbeat_at = now + config.heartbeat_interval_s
        if config.preferred_leader_id and now >= self.next_preferred_check_at:
            self.next_preferred_check_at = now + config.preferred_leader_check_interval_s
            self._check_preferred_leader()
        return max(0.0, self.next_heartbeat_at - now)

    def _quorum_silent_for(self, now: float) -> float:
        """How long since a quorum (counting ourselves) last answered us."""
        need = self._acks_needed()
        if need <= 0:
            return 0.0
        times = sorted((self.last_contact.get(p, self.leader_since) for p in self.voter_peers), reverse=True)
        if len(times) < need:
            return now - self.leader_since
        return now - times[need - 1]

    async def _maintain_as_candidate(self) -> float:
        now = self.clock.now()
        if now < self.next_vote_at:
            return self.next_vote_at - now
        ms = self.member_state
        if self.store.read_only_reason or ms.repairing or not self.is_voter or (ms.cluster_seen and not ms.joined) \
                or self._vetoed():
            # A node that cannot write (disk full) must not lead: it could not
            # even append the entry that opens its term. Nor may one whose log
            # lacks entries it once acknowledged (repairing), nor a learner or
            # a node outside the configuration (joining, or removed), nor one
            # that lost its state while a cluster exists (it joins that one).
            # Others can.
            self.next_vote_at = now + self._election_timeout()
            if ms.repairing and self.is_voter:
                await self._probe()
            return max(0.0, self.next_vote_at - self.clock.now())
        await self.campaign()
        return 0.0

    # -------------------------------------------------------------- campaign
    async def campaign(self) -> None:
        ms = self.member_state
        transfer = ms.term_to_take_leadership == ms.term + 1
        if not transfer:
            if not await self._pre_vote():
                return
            if ms.role is not Role.CANDIDATE or self._must_join():
                return
        term = ms.start_campaign()
        self.observer.on_election(term)
        log.info("campaigning in term %d (ledger end %d/%d)%s", term, self.store.ledger_end_index,
                 self.store.ledger_end_term, " for a leadership transfer" if transfer else "")
        self._round_states = []
        answers = await self._ask_votes(term, pre_vote=False, transfer=transfer)
        if ms.role is not Role.CANDIDATE or ms.term != term:
            return
        result = tally_votes(term, self.quorum, answers)
        if result.result is not ParseResult.PASSED:
            self._diagnose()
        if result.result is ParseResult.PASSED and self._must_join():
            return
        if result.result is ParseResult.PASSED:
            log.info("won term %d with %d of %d votes", term, result.accepted, len(self.membership.current.voters))
            ms.found_cluster()
            ms.change_to_leader(term)
            return
        self._lost(result.max_term, f"vote in term {term}: {result.accepted} accepted")

    def _vetoed(self) -> str:
        return next((reason for veto in self.vetoes if (reason := veto())), "")

    def _must_join(self) -> bool:
        """A node that lost its state learned, while campaigning, that a
        cluster exists: it must join that one, not found another."""
        return self.member_state.cluster_seen and not self.member_state.joined

    async def _pre_vote(self) -> bool:
        ms = self.member_state
        self._round_states = []
        answers = await self._ask_votes(ms.term + 1, pre_vote=True, transfer=False)
        if ms.role is not Role.CANDIDATE:
            return False
        result = tally_votes(ms.term, self.quorum, answers)
        if result.result is ParseResult.PASSED:
            return True
        self._diagnose()
        self._lost(result.max_term, f"pre-vote for term {ms.term + 1}: {result.accepted} accepted, "
                                    f"{result.has_leader} see a leader, {result.bigger_ledger} have a longer log")
        return False

    def _lost(self, max_term: int, why: str) -> None:
        ms = self.member_state
        if max_term > ms.term:
            ms.adopt_term(max_term)
        self.next_vote_at = self.clock.now() + self._election_timeout()
        log.info("%s; next try in %.0f ms", why, (self.next_vote_at - self.clock.now()) * 1000)

    async def _ask_votes(self, term: int, pre_vote: bool, transfer: bool) -> list[tuple[int, int]]:
        """Ask every peer; stop as soon as a quorum granted or all answered.
        Each answer's voter state goes to `_round_states` too."""
        ms = self.member_state
        tasks = [asyncio.ensure_future(self._ask_vote(peer, term, pre_vote, transfer)) for peer in self.voter_peers]
        answers: list[tuple[int, int]] = []
        pending = set(tasks)
        deadline = self.clock.now() + self.config.rpc_timeout_s
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - self.clock.now()),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                answers += [t.result() for t in done if t.result() is not None]  # type: ignore[misc]
                # A node that lost its state hears everyone out: any answer
                # may name an existing cluster, which it must not found anew.
                if 1 + sum(1 for r, _ in answers if r == pb.ACCEPT) >= self.quorum and ms.joined:
                    break
                if ms.role is not Role.CANDIDATE:
                    break
        finally:
            for t in pending:
                t.cancel()
        return answers

    async def _ask_vote(self, peer: str, term: int, pre_vote: bool, transfer: bool) -> tuple[int, int] | None:
        store = self.store
        request = pb.VoteRequest(
            header=pb.Header(group=self.config.group, remote_id=peer, local_id=self.config.self_id, term=term),
            ledger_end_index=store.ledger_end_index, ledger_end_term=store.ledger_end_term,
            pre_vote=pre_vote, leadership_transfer=transfer, cluster_id=self.member_state.cluster_id,
            incarnation=self.membership.incarnation_of(self.config.self_id))
        try:
            response = await self.transport.vote(peer, request, self.config.rpc_timeout_s)
        except TransportError:
            return None
        self.member_state.see_cluster(response.cluster_id)
        self._round_states.append(VoterState(
            peer, (response.ledger_end_term, response.ledger_end_index), response.repairing,
            (response.repair_term, response.repair_until) if response.repairing and response.repair_until >= 0
            else None))
        return response.result, response.header.term

    # ---------------------------------------------------- no intact leader
    def _diagnose(self) -> None:
        """After a vote round that elected nobody: whether voters that lost
        committed entries refuse every reachable candidate (vote_rules.no_intact_leader)."""
        ms, store = self.member_state, self.store
        me = VoterState(ms.self_id, (store.ledger_end_term, store.ledger_end_index), ms.repairing, ms.repair_floor)
        reason = no_intact_leader(self.membership.current.voters, [me, *self._round_states])
        if reason and reason != self.no_intact_reason:
            log.error("%s", reason)
        self.no_intact_reason, self.no_intact_at = reason, self.clock.now()

    def no_intact_copy(self) -> str:
        """The reason clients are refused with NO_INTACT_COPY, while it is
        fresh (a round within the last few election timeouts) and no leader
        has been heard since; "" otherwise."""
        fresh = self.clock.now() - self.no_intact_at <= NO_INTACT_FRESH_TIMEOUTS * self.config.election_timeout_max_s
        return self.no_intact_reason if fresh and not self.member_state.leader_id else ""

    async def _probe(self) -> None:
        """A repairing voter never campaigns, but asks the others what a
        pre-vote would (it changes nothing anywhere), to learn whether any
        of them can lead: clients then hear why nobody does."""
        self._round_states = []
        await self._ask_votes(self.member_state.term + 1, pre_vote=True, transfer=False)
        if self.member_state.role is Role.CANDIDATE:
            self._diagnose()

    # ------------------------------------------------------------ heartbeats
    def _send_heartbeats(self) -> None:
        for peer in self.peers:
            task = asyncio.get_running_loop().create_task(self._heartbeat(peer, self.member_state.term))
            self._heartbeats.add(task)
            task.add_done_callback(self._heartbeats.discard)

    async def _heartbeat(self, peer: str, term: int) -> bool:
        """One heartbeat; True when the peer accepted our leadership of `term`."""
        ms = self.member_state
        request = pb.HeartBeatRequest(
            header=pb.Header(group=self.config.group, remote_id=peer, local_id=self.config.self_id,
                             leader_id=self.config.self_id, term=term),
            committed_index=ms.committed_index, cluster_id=ms.cluster_id)
        try:
            response = await self.transport.heartbeat(peer, request, self.config.rpc_timeout_s)
        except TransportError:
            return False
        if response.header.term > ms.term:
            log.info("%s answered heartbeat with term %d > %d: stepping down", peer, response.header.term, ms.term)
            ms.adopt_term(response.header.term)
            return False
        if ms.term == term and response.header.code == ResponseCode.SUCCESS:
            self.last_contact[peer] = self.clock.now()
            return True
        return False

    def note_contact(self, peer: str) -> None:
        """Any successful answer from a follower proves the quorum is there."""
        self.last_contact[peer] = self.clock.now()

    # -------------------------------------------------- incoming peer requests
    def accept_leader(self, header: pb.Header) -> None:
        """A heartbeat or push from a leader: adopt its term and follow it."""
        ms = self.member_state
        if header.term < ms.term:
            raise DLedgerError(ResponseCode.EXPIRED_TERM, f"term {header.term} < my term {ms.term}")
        if header.term > ms.term:
            ms.adopt_term(header.term)
        if ms.role is Role.LEADER:
            raise DLedgerError(ResponseCode.INCONSISTENT_LEADER,
                               f"{header.leader_id} claims leadership of term {ms.term}, which I lead")
        if ms.term_to_take_leadership == ms.term + 1:
            return  # taking over by transfer: keep campaigning, but keep the pushes coming
        if ms.role is Role.CANDIDATE or not ms.leader_id:
            ms.change_to_follower(header.leader_id)
        elif ms.leader_id != header.leader_id:
            raise DLedgerError(ResponseCode.INCONSISTENT_LEADER,
                               f"{header.leader_id} claims term {ms.term}, led by {ms.leader_id}")
        ms.touch_leader()

    def handle_heartbeat(self, request: pb.HeartBeatRequest) -> pb.HeartBeatResponse:
        self.accept_leader(request.header)
        self.on_leader_commit(request.committed_index)
        return pb.HeartBeatResponse(header=pb.Header(code=ResponseCode.SUCCESS))

    def handle_vote(self, request: pb.VoteRequest) -> pb.VoteResponse:
        ms, store = self.member_state, self.store
        view = VoterView(self_id=ms.self_id, peer_ids=frozenset(self.membership.current.voters), term=ms.term,
                         vote_for=ms.vote_for, ledger_end_term=store.ledger_end_term,
                         ledger_end_index=store.ledger_end_index, leader_alive=ms.leader_is_alive(),
                         taking_leadership=ms.term_to_take_leadership == ms.term + 1,
                         cluster_id=ms.cluster_id, joined=ms.joined, repairing=ms.repairing,
                         repair_floor=ms.repair_floor, voter=self.is_voter, cluster_seen=ms.cluster_seen)
        header = request.header
        ms.see_cluster(request.cluster_id)
        decision = decide_vote(view, header.local_id, header.term, request.ledger_end_term,
                               request.ledger_end_index, request.pre_vote, request.leadership_transfer,
                               request.cluster_id, request.incarnation,
                               self.membership.incarnation_of(header.local_id))
        if decision.adopt_term:
            ms.adopt_term(header.term)
        if decision.grant:
            ms.vote(header.local_id)
            # Granting a vote restarts our own election timer (Raft §5.2).
            ms.touch_leader()
            self.next_vote_at = self.clock.now() + self._election_timeout()
        if decision.result != pb.ACCEPT or not request.pre_vote:
            # A repairing voter says what it judged by (the chaos checks read it).
            floor = (f" (repairing: candidate log ({request.ledger_end_term}, {request.ledger_end_index}),"
                     f" repair floor {view.repair_floor})" if view.repairing else "")
            log.info("%svote for %s in term %d: %s%s", "pre-" if request.pre_vote else "",
                     header.local_id, header.term, decision.reason, floor)
        floor_term = view.repair_floor[0] if view.repair_floor else -1
        return pb.VoteResponse(header=pb.Header(code=ResponseCode.SUCCESS), result=decision.result,
                               ledger_end_index=store.ledger_end_index, ledger_end_term=store.ledger_end_term,
                               cluster_id=ms.cluster_id, repairing=ms.repairing,
                               repair_until=ms.repair_until if ms.repairing else -1,
                               repair_term=floor_term if ms.repairing else -1)

    # ------------------------------------------------------ leadership transfer
    async def transfer_leadership(self, transferee: str) -> None:
        """On the leader: block appends, let `transferee` catch up and take over."""
        ms, config = self.member_state, self.config
        if not ms.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, "only the leader can transfer leadership",
                               leader_id=ms.leader_id, leader_address=ms.leader_address)
        if transferee not in self.voter_peers:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{transferee!r} is not another voter of the group")
        if ms.transferee:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, f"already transferring to {ms.transferee}")
        lag = self.store.ledger_end_index - self.peer_watermark(transferee)
        if lag > config.max_leadership_transfer_wait_index:
            raise DLedgerError(ResponseCode.FALL_BEHIND_TOO_MUCH, f"{transferee} is {lag} entries behind")
        term = ms.term
        ms.transferee = transferee
        log.info("transferring leadership of term %d to %s (lag %d)", term, transferee, lag)
        request = pb.LeadershipTransferRequest(
            header=pb.Header(group=config.group, remote_id=transferee, local_id=config.self_id,
                             leader_id=config.self_id, term=term),
            transferee_id=transferee, take_leadership_ledger_index=self.store.ledger_end_index, from_leader=True)
        try:
            response = await self.transport.leadership_transfer(transferee, request,
                                                                config.leadership_transfer_timeout_s)
        except TransportError as e:
            raise DLedgerError(ResponseCode.TAKE_LEADERSHIP_FAILED, f"{transferee} unreachable: {e}") from None
        finally:
            if ms.term == term:
                ms.transferee = ""
        if response.header.code != ResponseCode.SUCCESS:
            raise DLedgerError(ResponseCode.of(response.header.code),
                               f"{transferee} did not take over: {response.header.message}")

    async def take_leadership(self, request: pb.LeadershipTransferRequest) -> None:
        """On the transferee: catch up to the leader's end, then campaign at once."""
        ms, config = self.member_state, self.config
        if request.header.term != ms.term or request.header.local_id != ms.leader_id:
            raise DLedgerError(ResponseCode.EXPIRED_TERM,
                               f"transfer from {request.header.local_id} in term {request.header.term}, "
                               f"but I follow {ms.leader_id!r} in term {ms.term}")
        deadline = self.clock.now() + config.leadership_transfer_timeout_s / 2
        while self.store.ledger_end_index < request.take_leadership_ledger_index:
            if self.clock.now() > deadline:
                raise DLedgerError(ResponseCode.TAKE_LEADERSHIP_FAILED,
                                   f"did not catch up to {request.take_leadership_ledger_index} in time")
            await asyncio.sleep(TRANSFER_POLL_S)
        target = ms.term + 1
        ms.term_to_take_leadership = target
        ms.change_to_candidate()
        self.next_vote_at = self.clock.now()
        self.wakeup.set()
        while self.clock.now() < deadline + config.leadership_transfer_timeout_s / 2:
            if ms.term >= target and ms.role is Role.LEADER:
                return
            if ms.term > target or (ms.term == target and ms.role is Role.FOLLOWER):
                break
            await asyncio.sleep(TRANSFER_POLL_S)
        if ms.term_to_take_leadership == target:
            ms.term_to_take_leadership = -1
        raise DLedgerError(ResponseCode.TAKE_LEADERSHIP_FAILED, f"did not win term {target}")

    def _check_preferred_leader(self) -> None:
        preferred = self.config.preferred_leader_id
        ms = self.member_state
        if preferred == ms.self_id or preferred not in self.voter_peers or ms.transferee:
            return
        lag = self.store.ledger_end_index - self.peer_watermark(preferred)
        if lag > self.config.max_leadership_transfer_wait_index:
            return
        if self.clock.now() - self.last_contact.get(preferred, float("-inf")) > self.config.election_timeout_min_s:
            return

        async def hand_over() -> None:
            try:
                await self.transfer_leadership(preferred)
            except DLedgerError as e:
                log.info("handing over to preferred leader %s failed: %s", preferred, e.message)

        asyncio.get_running_loop().create_task(hand_over())
