"""DLedgerServer: builds one node's parts and starts and stops them.

Parts: the file store, MemberState, the election loop, the entry pusher, and
the housekeeping tasks (checkpoint, retention, disk check). Every request
handler here validates its input and raises DLedgerError; dledger/rpc turns
that into a response in one place.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from typing import AsyncIterator, Callable, Sequence

from dledger.clock import Clock, MonotonicClock
from dledger.config import DLedgerConfig
from dledger.elector import DLedgerLeaderElector
from dledger.entry import CHANNEL_LOG_API, MAGIC_CONFIG_CHANGE, USER_MAGICS, DLedgerEntry
from dledger.producer_table import check_producer_request
from dledger.errors import CorruptLogError, DLedgerError, ResponseCode
from dledger.member_state import MemberState, Role
from dledger.membership import (Membership, MembershipLog, check_can_change, plan_add, plan_move,
                                plan_remove)
from dledger.pusher.pusher import AppendResult, DLedgerEntryPusher
from dledger.status import NodeStatus, NullObserver, PeerStatus, ServerObserver
from dledger.loop_lag import LoopLagMonitor
from dledger.cpu_contention import CpuContention
from dledger.read_pacer import ReadPacer, Verdict, should_yield
from dledger.producer_table import Snapshot
from dledger.raw_run import RawRunResponse
from dledger.store.file_store import AppendHook, DLedgerFileStore, RawRunPlan
from dledger.store.properties import write_atomic
from dledger.tasks import fail_stop, start_task
from dledger.transport import Transport
from rpcgen import dledger_pb2 as pb

log = logging.getLogger(__name__)

# A Read stream sends batches of about this many bytes unless asked otherwise.
DEFAULT_READ_BATCH_BYTES = 1 << 20
# ... and at most this many, whatever it asks (a message must stay far below
# the clients' 256 MiB limit).
MAX_READ_BATCH_BYTES = 64 << 20
# A member is moved to a new address only once the leader has not heard from
# it for this many (maximum) election timeouts: a live one answers every
# heartbeat interval.
MOVE_SILENCE_ELECTION_TIMEOUTS = 2
# While the node's writes wait for a core, the scrubber reads this many times
# slower (1 MiB/s at the default 8 MiB/s): damage is still found, later.
SCRUB_YIELD_SLOWDOWN = 8


class DLedgerServer:
    def __init__(self, config: DLedgerConfig, transport: Transport, observer: ServerObserver | None = None,
                 clock: Clock | None = None) -> None:
        config.validate()
        self.config = config
        self.transport = transport
        self.observer: ServerObserver = observer or NullObserver()
        self.clock = clock or MonotonicClock()
        self.store = DLedgerFileStore(config)
        self.store.on_fatal = lambda reason: fail_stop("the log store", DLedgerError(ResponseCode.DISK_ERROR, reason))
        self.member_state = MemberState(config, self.clock)
        self.member_state.client_address_of = self.client_address_of
        self.membership = MembershipLog(config, self.store.base_dir)
        self._commit_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.pusher: DLedgerEntryPusher | None = None
        self.elector: DLedgerLeaderElector | None = None
        self.started = False
        self._producers_path = os.path.join(self.store.base_dir, "producers")
        # Retention keeps the entries after the table's last snapshot: a restart
        # replays their producer marks.
        self._producers_snapshot_index = -1
        # Each returns the first index its owner (a state machine built on the
        # log, such as the message store) still needs; retention keeps it.
        self.retention_floors: list[Callable[[], int]] = []
        # Each returns why this node must not lead now ("" when it may): a
        # state machine built on the log that has stopped (the message
        # store's apply loop) would answer every client with an error, so
        # such a node neither campaigns nor stays leader while others can.
        self.leadership_vetoes: list[Callable[[], str]] = []
        self.loop_lag = LoopLagMonitor()
        self.cpu_contention = CpuContention()
        # The port of this node's peer link (dledger/rpc/peer_link.py), told
        # to the leader in every heartbeat answer; 0: none.
        self.peer_link_port = 0
        # The port of this node's client link (dledger/rpc/client_link.py),
        # named in every AppendStream answer; 0: none.
        self.client_link_port = 0
        self._end_at_last_verdict = -1   # the log's end when the pacer last asked (_replays_should_yield)
        self.read_pacer = ReadPacer(self._replays_should_yield, config.replay_floor_bytes_per_s,
                                    enabled=config.replay_yield_wait_share > 0 and self.cpu_contention.available)
        self.repairs = 0   # times this process found damage and started a repair
        self._hand_over: asyncio.Task[None] | None = None   # after this leader removed itself

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.member_state.load()
        self.store.open()
        if self.store.damaged_from >= 0:
            self.repairs += 1
            self.member_state.start_repair(self.store.acknowledged_end, self.store.acknowledged_end_term)
        self.member_state.committed_index = self.store.committed_index
        self._load_membership()
        self.pusher = DLedgerEntryPusher(self.config, self.store, self.member_state, self.transport,
                                         self.clock, self._on_commit, self.membership)
        self.elector = DLedgerLeaderElector(self.config, self.member_state, self.store, self.transport,
                                            self.clock, self.observer, self._peer_watermark,
                                            self.pusher.handler.advance_commit, self.membership)
        self.elector.vetoes = self.leadership_vetoes
        self.pusher.on_removed = self._hand_over_after_removal
        self.pusher.load_producers(self._producers_path)
        self._producers_snapshot_index = self.pusher.producers.applied_index
        self.pusher.start()
        self._tasks = [start_task(self.loop_lag.run(), "LoopLagMonitor"),
                       start_task(self.cpu_contention.run(), "CpuContention"),
                       start_task(self._scrubber(), "Scrubber"),
                       start_task(self.elector.run(), "DLedgerLeaderElector"),
                       start_task(self._checkpointer(), "Checkpointer"),
                       start_task(self._retention(), "CleanSpaceService")]
        self.started = True
        log.info("node %s started: term %d, ledger [%d, %d], committed %d", self.config.self_id,
                 self.member_state.term, self.store.ledger_begin_index, self.store.ledger_end_index,
                 self.member_state.committed_index)

    def _load_membership(self) -> None:
        store, membership = self.store, self.membership

        def scan(after: int) -> list[tuple[int, bytes]]:
            indexes = store.indexes_with_magic(after + 1, store.ledger_end_index, MAGIC_CONFIG_CHANGE)
            return [(index, store.get(index).body) for index in indexes]

        membership.load(scan)
        membership.commit(self.member_state.committed_index)
        store.on_config_entry = membership.appended
        store.on_truncate = membership.truncated
        membership.listeners.append(self._on_membership_change)
        self._on_membership_change(membership.current)

    def _hand_over_after_removal(self) -> None:
        """This leader's removal is committed: hand leadership to the voter
        that holds the most (so that the group need not wait out an election
        timeout), then step down; it never campaigns again."""
        assert self.elector is not None and self.pusher is not None
        elector, pusher, ms = self.elector, self.pusher, self.member_state
        term = ms.term
        successors = sorted(elector.voter_peers, key=self._peer_watermark, reverse=True)

        async def hand_over() -> None:
            try:
                if successors:
                    log.info("this leader's removal is committed: handing leadership to %s", successors[0])
                    await elector.transfer_leadership(successors[0])
            except DLedgerError as error:
                log.info("handing leadership to %s failed (%s): stepping down", successors[0], error.message)
            finally:
                if ms.is_leader and ms.term == term:
                    pusher.step_down_removed()

        self._hand_over = asyncio.get_running_loop().create_task(hand_over())

    def _on_membership_change(self, current: Membership) -> None:
        update = getattr(self.transport, "update_peers", None)
        if update is not None:
            update({peer: self.membership.address_of(peer) for peer in self.membership.replication_targets()})

    def address_of(self, peer_id: str) -> str:
        """The address peers use for `peer_id` (its configuration's, or --peers')."""
        return self.membership.address_of(peer_id)

    def client_address_of(self, peer_id: str) -> str:
        """The address a client should use for node `peer_id`: the one its
        `member add` gave, else this node's --advertised-addresses, else its
        peer address."""
        added = self.membership.current.client_address_of(peer_id)
        if added:
            return added
        for p in self.config.advertised_addresses:
            if p.id == peer_id:
                return p.address
        return self.membership.address_of(peer_id)

    async def shutdown(self) -> None:
        if not self.started:
            return
        self.started = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self.pusher is not None
        await self.pusher.stop()
        for _, waiter in self._commit_waiters:
            if not waiter.done():
                waiter.set_exception(DLedgerError(ResponseCode.TERM_CHANGED, "the node is shutting down"))
        self._commit_waiters.clear()
        self.store.close()
        self._save_producers()
        log.info("node %s stopped", self.config.self_id)

    # -------------------------------------------------------------- commits
    def _on_commit(self, committed: int) -> None:
        self.membership.commit(committed)
        if self.pusher is not None:
            self.pusher.apply_committed(committed)
        if not self._commit_waiters:
            return
        keep = []
        for index, waiter in self._commit_waiters:
            if index <= committed:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                keep.append((index, waiter))
        self._commit_waiters = keep

    async def wait_committed(self, index: int, timeout: float | None = None) -> None:
        """Wait until entry `index` is committed on this node."""
        if self.member_state.committed_index >= index:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commit_waiters.append((index, waiter))
        await asyncio.wait_for(waiter, timeout)

    def leader_ready_from(self) -> int | None:
        """On a leader that takes appends: the index of the entry that opened its
        term (a state machine above must have applied up to it before it serves
        writes from its own state); None when this node cannot take appends."""
        if self.pusher is None or not self.member_state.is_leader or not self.pusher.is_ready():
            return None
        return self.pusher.term_first_index

    def _peer_watermark(self, peer_id: str) -> int:
        assert self.pusher is not None
        return self.pusher.quorum.watermark(self.member_state.term, peer_id)

    # ------------------------------------------------------- request checks
    def check_peer_header(self, header: pb.Header) -> None:
        self.check_group(header)
        if header.remote_id != self.config.self_id:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER,
                               f"request addressed to {header.remote_id!r}, but this is {self.config.self_id!r}")
        if header.local_id == self.config.self_id or (
                header.local_id not in self.membership.known_ids() and not self._waiting_to_join()):
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{header.local_id!r} is not a peer of this group")

    def _waiting_to_join(self) -> bool:
        """Started with --join and not a member yet: whichever leader adds
        this node may contact it, even one its --peers did not name."""
        return self.config.join and self.config.self_id not in self.membership.current.ids

    def check_group(self, header: pb.Header) -> None:
        if header.group and header.group != self.config.group:
            raise DLedgerError(ResponseCode.UNKNOWN_GROUP,
                               f"group {header.group!r} is not served here (this is {self.config.group!r})")

    def _require_started(self) -> tuple[DLedgerLeaderElector, DLedgerEntryPusher]:
        if not self.started or self.elector is None or self.pusher is None:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY, "the node is starting or stopping")
        return self.elector, self.pusher

    def _not_leader(self) -> DLedgerError:
        ms = self.member_state
        if not ms.leader_id and self.elector is not None and (reason := self.elector.no_intact_copy()):
            # Not "no leader yet": none can be elected without losing data.
            return DLedgerError(ResponseCode.NO_INTACT_COPY, reason)
        who = f"the leader is {ms.leader_id} at {ms.leader_address}" if ms.leader_id else "no leader is known yet"
        repairing = (f"; this node is repairing its log up to entry {ms.repair_until} and cannot lead until then"
                     if ms.repairing else "")
        return DLedgerError(ResponseCode.NOT_LEADER, f"{self.config.self_id} is not the leader; {who}{repairing}",
                            leader_id=ms.leader_id, leader_address=ms.leader_address)

    # ---------------------------------------------------------- membership
    async def change_membership(self, action: int, member_id: str, address: str, client_address: str = ""
                                ) -> tuple[int, Membership]:
        """On the leader: add a server (as a learner; the leader promotes it
        once caught up) or remove one. Returns once the change is committed:
        (the configuration entry's index, or -1 when there was nothing to do;
        the configuration)."""
        _, pusher = self._require_started()
        if not self.member_state.is_leader:
            raise self._not_leader()
        check_can_change(self.membership.pending_index, pusher.is_ready())
        current = self.membership.current
        if action == pb.ADD_MEMBER:
            planned = plan_add(current, member_id, address, client_address, self.config.mutual_tls)
            if planned is None:
                return -1, current
        elif action == pb.REMOVE_MEMBER:
            planned = plan_remove(current, member_id)
        elif action == pb.MOVE_MEMBER:
            planned = plan_move(current, member_id, address, self.config.self_id, self._silent_for(member_id),
                                MOVE_SILENCE_ELECTION_TIMEOUTS * self.config.election_timeout_max_s,
                                client_address, self.config.mutual_tls)
            if planned is None:
                return -1, current
        else:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"unknown membership action {action}")
        log.info("membership change requested: %s %s; from %s to %s", pb.MembershipAction.Name(action),
                 member_id, current.describe(), planned.describe())
        first, _, _ = await pusher.append_config(planned)
        return first, planned

    def _silent_for(self, member_id: str) -> float:
        """How long this leader has not heard from `member_id` (at most since it leads)."""
        assert self.elector is not None
        elector = self.elector
        return self.clock.now() - elector.last_contact.get(member_id, elector.leader_since)

    async def handle_change_membership(self, request: pb.ChangeMembershipRequest) -> pb.ChangeMembershipResponse:
        self.check_group(request.header)
        index, membership = await self.change_membership(request.action, request.member_id, request.address,
                                                         request.client_address)
        return pb.ChangeMembershipResponse(members=members_to_pb(membership), index=index)

    def handle_list_members(self, request: pb.ListMembersRequest) -> pb.ListMembersResponse:
        self._require_started()
        self.check_group(request.header)
        if not self.member_state.is_leader:
            raise self._not_leader()
        return pb.ListMembersResponse(members=members_to_pb(self.membership.current),
                                      pending_index=self.membership.pending_index)

    # ----------------------------------------------------------- peer RPCs
    def handle_vote(self, request: pb.VoteRequest) -> pb.VoteResponse:
        elector, _ = self._require_started()
        self.check_peer_header(request.header)
        return elector.handle_vote(request)

    def handle_heartbeat(self, request: pb.HeartBeatRequest) -> pb.HeartBeatResponse:
        elector, _ = self._require_started()
        self.check_peer_header(request.header)
        self._check_cluster(request.cluster_id)
        response = elector.handle_heartbeat(request)
        self.member_state.learn_cluster(request.cluster_id, request.committed_index)
        response.peer_link_port = self.peer_link_port
        return response

    async def handle_push(self, request: pb.PushEntryRequest) -> pb.PushEntryResponse:
        elector, pusher = self._require_started()
        self.check_peer_header(request.header)
        if request.type == pb.APPEND and request.entry_count <= 0:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "APPEND push without entries")
        self._check_cluster(request.cluster_id)
        elector.accept_leader(request.header)
        self.member_state.learn_cluster(request.cluster_id, request.committed_index)
        return await pusher.handler.handle(request)

    def _check_cluster(self, cluster_id: str) -> None:
        known = self.member_state.cluster_id
        if known and cluster_id and known != cluster_id:
            raise DLedgerError(ResponseCode.UNKNOWN_GROUP,
                               f"this node belongs to cluster {known}, the sender to {cluster_id}")

    async def handle_leadership_transfer(self, request: pb.LeadershipTransferRequest) -> pb.LeadershipTransferResponse:
        elector, _ = self._require_started()
        if request.from_leader:
            self.check_peer_header(request.header)
            await elector.take_leadership(request)
        else:
            self.check_group(request.header)
            if not request.transferee_id:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "transferee_id is required")
            if not self.member_state.is_leader:
                raise self._not_leader()
            await elector.transfer_leadership(request.transferee_id)
        return pb.LeadershipTransferResponse()

    # --------------------------------------------------------- client RPCs
    async def append(self, bodies: Sequence[bytes], producer_id: str = "", sequence: int = -1,
                     prepare: AppendHook | None = None, channel: int = CHANNEL_LOG_API,
                     retry_age_ms: int = 0) -> AppendResult:
        """Append through this node, which must be the leader; returns
        (first index, last index, positions) once committed. See
        DLedgerEntryPusher.append for `producer_id`, `sequence`, `prepare` and
        `channel` (the Append RPC always writes CHANNEL_LOG_API); `retry_age_ms`
        is how long ago the client first sent this request (ProducerTable)."""
        _, pusher = self._require_started()
        check_producer_request(producer_id, sequence)
        self.check_bodies(bodies)
        if not self.member_state.is_leader:
            raise self._not_leader()
        started = self.clock.now()
        result = await pusher.append(bodies, producer_id, sequence, prepare, channel, retry_age_ms)
        self.observer.on_append(self.clock.now() - started, len(bodies))
        return result

    def check_bodies(self, bodies: Sequence[bytes]) -> None:
        """Refuse an append with no body, too many, or one too large."""
        if not bodies:
            raise DLedgerError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "an append needs at least one body")
        if len(bodies) > self.config.max_append_batch_entries:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"{len(bodies)} bodies in one append; at most {self.config.max_append_batch_entries}")
        limit = self.config.max_entry_size
        for i, body in enumerate(bodies):
            if len(body) > limit:
                raise DLedgerError(ResponseCode.ENTRY_TOO_LARGE,
                                   f"body {i} has {len(body)} bytes; the maximum is {limit}")

    async def handle_append(self, request: pb.AppendRequest) -> pb.AppendResponse:
        self.check_group(request.header)
        if request.retry_age_ms < 0:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"retry_age_ms {request.retry_age_ms} is negative")
        first, last, positions = await self.append(list(request.bodies), request.producer_id,
                                                   request.sequence, retry_age_ms=request.retry_age_ms)
        return pb.AppendResponse(first_index=first, last_index=last, positions=positions)

    async def handle_get(self, request: pb.GetRequest) -> pb.GetResponse:
        self._require_started()
        self.check_group(request.header)
        await self.confirm_leadership()
        entry = self.get_committed(request.index)
        return pb.GetResponse(entry=entry_to_pb(entry))

    async def confirm_leadership(self) -> None:
        """ReadIndex: NOT_LEADER unless this node leads, has committed an
        entry of its term, and a majority confirmed its leadership after
        the call began (dledger/read_index.py)."""
        elector, pusher = self._require_started()
        if not self.member_state.is_leader:
            raise self._not_leader()
        if not pusher.is_ready():
            raise DLedgerError(ResponseCode.LEADER_NOT_READY,
                               "a new leader serves reads once an entry of its term is committed")
        await elector.read_index.confirm()

    def get_committed(self, index: int) -> DLedgerEntry:
        store = self.store
        if index < store.ledger_begin_index:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                               f"index {index} is below the ledger begin index {store.ledger_begin_index}")
        committed = self.member_state.committed_index
        if index > committed:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                               f"index {index} is above the committed index {committed}")
        try:
            return store.get(index)
        except CorruptLogError as error:
            raise self._damage_found_by_read(index, error) from None

    def _damage_found_by_read(self, start: int, error: CorruptLogError) -> DLedgerError:
        """A read met a damaged committed entry: find it, repair (as the
        scrubber would have), and answer that this node cannot serve it now."""
        store, index, damaged = self.store, start, -1
        limit = min(self.member_state.committed_index, store.ledger_end_index)
        try:
            while damaged < 0 and index <= limit:
                index, damaged = store.find_damage(index, 4 << 20)
        except (CorruptLogError, DLedgerError):
            damaged = index
        if damaged >= 0:
            self.repair_damage(damaged)
        return DLedgerError(ResponseCode.CORRUPT_LOG,
                            f"{self.config.self_id} holds a damaged entry ({error.message}); it is repairing its "
                            f"log from the leader: read from another node, or again once it is repaired")

    async def handle_read(self, request: pb.ReadRequest) -> AsyncIterator[pb.ReadResponse | RawRunResponse]:
        """Committed entries of this node's own log, in batches."""
        self._require_started()
        self.check_group(request.header)
        confirmed = False
        if request.require_leader or self.member_state.is_leader:
            # From the leader, a read sees everything committed before it began.
            await self.confirm_leadership()
            confirmed = True
        start, end = self._read_bounds(request.start_index, request.end_index)
        batch_bytes = min(request.max_batch_bytes, MAX_READ_BATCH_BYTES) if request.max_batch_bytes > 0 \
            else DEFAULT_READ_BATCH_BYTES
        if request.raw:
            return self._read_raw_runs(start, end, batch_bytes, confirmed)
        return self._read_batches(start, end, batch_bytes, request.include_system, confirmed)

    def _read_bounds(self, start_index: int, end_index: int) -> tuple[int, int]:
        """A read's range (-1: the log's begin, the committed index), refused
        where this node cannot serve all of it."""
        store = self.store
        committed = self.member_state.committed_index
        start = store.ledger_begin_index if start_index < 0 else start_index
        end = committed if end_index < 0 else end_index
        if start < store.ledger_begin_index:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                               f"start {start} is below the ledger begin index {store.ledger_begin_index}")
        if end > committed:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                               f"end {end} is above the committed index {committed}")
        if self.member_state.repairing and end > store.ledger_end_index:
            # Its log was cut before a damaged entry: say so rather than
            # answer a shorter range as if it were all.
            raise DLedgerError(ResponseCode.CORRUPT_LOG,
                               f"{self.config.self_id} lost entries {store.ledger_end_index + 1}..{end} (damaged "
                               f"on its disk) and is repairing them from the leader: read them from another node")
        return start, end

    def _replays_should_yield(self) -> Verdict:
        """ReadPacer's verdict (dledger/read_pacer.py's `should_yield`), asked
        at most every 0.1 s; writing: the log grew since the last verdict."""
        end = self.store.ledger_end_index
        writing, self._end_at_last_verdict = end != self._end_at_last_verdict, end
        return self._yield_verdict(writing)

    def _yield_verdict(self, writing: bool) -> Verdict:
        """Whether background reads (replays, the scrubber) give way to the node's writes."""
        return should_yield(writing, self.cpu_contention, self.config.replay_yield_wait_share,
                            self.config.replay_yield_min_wait)

    def plan_raw_reads(self, group: str, start_index: int, end_index: int, run_bytes: int,
                       budget_bytes: int) -> list[RawRunPlan]:
        """Where the committed entries [start_index, end_index] lie, as runs of
        at most `run_bytes`, for about `budget_bytes` from the start: a raw read
        that sends the files' bytes itself (cluster/raw_read_http.py) asks again
        from after the last run. The same bounds as a Read; no leadership check,
        since a range at or below the committed index is the same on every node."""
        self._require_started()
        self.check_group(pb.Header(group=group))
        start, end = self._read_bounds(start_index, end_index)
        run_bytes = min(max(run_bytes, 1), MAX_READ_BATCH_BYTES)
        plans: list[RawRunPlan] = []
        index, planned = start, 0
        while index <= end and planned < budget_bytes:
            try:
                plan = self.store.plan_raw_run(index, run_bytes, end - index + 1)
            except CorruptLogError as error:
                raise self._damage_found_by_read(index, error) from None
            if plan is None:
                break
            plans.append(plan)
            index += plan.count
            planned += plan.length
        return plans

    async def _read_raw_runs(self, start: int, end: int, batch_bytes: int,
                             confirmed: bool) -> AsyncIterator[RawRunResponse]:
        """The range as stored, a run of back-to-back entries per response:
        no per-entry work here (the reader checks the CRCs), so a replay
        costs this node a pread and a copy per megabyte."""
        index = start
        while index <= end:
            try:
                records, data, count = self.store.read_raw_run(index, batch_bytes, end - index + 1)
            except CorruptLogError as error:
                raise self._damage_found_by_read(index, error) from None
            if not count:
                break
            index += count
            wait = self.read_pacer.delay(len(data))
            if wait:
                await asyncio.sleep(wait)   # the node's own work waits for its loop: the replay yields
            yield RawRunResponse(records, data, self.member_state.committed_index, confirmed)

    async def _read_batches(self, start: int, end: int, batch_bytes: int,
                            include_system: bool, confirmed: bool) -> AsyncIterator[pb.ReadResponse]:
        index = start
        while index <= end:
            try:
                entries = self.store.read_entries(index, end, batch_bytes)
            except CorruptLogError as error:
                raise self._damage_found_by_read(index, error) from None
            if not entries:
                break
            index = entries[-1].index + 1
            if not include_system:
                entries = [e for e in entries if e.magic in USER_MAGICS]
            if entries:
                yield pb.ReadResponse(entries=[entry_to_pb(e) for e in entries],
                                      committed_index=self.member_state.committed_index,
                                      leader_confirmed=confirmed)

    def handle_metadata(self, request: pb.MetadataRequest, pid: int, metrics_address: str) -> pb.MetadataResponse:
        self.check_group(request.header)
        s = self.status()
        return pb.MetadataResponse(
            group=s.group, self_id=s.self_id, role=s.role, term=s.term, leader_id=s.leader_id,
            leader_address=s.leader_address, ledger_begin_index=s.ledger_begin_index,
            ledger_end_index=s.ledger_end_index, ledger_end_term=s.ledger_end_term,
            committed_index=s.committed_index, flushed_index=s.flushed_index, pid=pid,
            metrics_address=metrics_address, cluster_id=self.member_state.cluster_id,
            repairing=s.repairing, repair_until=s.repair_until,
            no_intact_copy=self.elector.no_intact_copy() if self.elector is not None else "",
            client_link_port=self.client_link_port,
            peers=[pb.PeerState(id=p.id, address=p.address, watermark=p.watermark, lag=p.lag, role=p.role)
                   for p in s.peers])

    # --------------------------------------------------------------- status
    def status(self) -> NodeStatus:
        ms, store = self.member_state, self.store
        peers = []
        for peer in self.membership.current.members:
            if ms.is_leader and self.pusher is not None:
                mark = (store.flushed_index if peer.id == self.config.self_id
                        else self.pusher.quorum.watermark(ms.term, peer.id))
                peers.append(PeerStatus(peer.id, self.client_address_of(peer.id), mark,
                                        store.ledger_end_index - mark, peer.role))
            else:
                peers.append(PeerStatus(peer.id, self.client_address_of(peer.id), -1, -1, peer.role))
        return NodeStatus(
            group=self.config.group, self_id=self.config.self_id, role=ms.role.value, term=ms.term,
            leader_id=ms.leader_id, leader_address=ms.leader_address,
            ledger_begin_index=store.ledger_begin_index, ledger_end_index=store.ledger_end_index,
            ledger_end_term=store.ledger_end_term, committed_index=ms.committed_index,
            flushed_index=store.flushed_index,
            pending_appends=self.pusher.quorum.pending_entries() if self.pusher else 0, peers=peers,
            loop_lag_s=self.loop_lag.lag_s, loop_stalls=self.loop_lag.stalls,
            loop_cpu_wait_share=self.cpu_contention.wait_share,
            replay_pace_bytes_per_s=self.read_pacer.rate_bytes_per_s,
            repairing=ms.repairing, repair_until=ms.repair_until, repairs=self.repairs)

    # ---------------------------------------------------------------- repair
    async def _scrubber(self) -> None:
        """Re-verify committed entries (CRCs and chain links) round and round,
        at config.scrub_bytes_per_s, so that damage is found while the other
        replicas still hold the entry, not when someone needs it. While the
        node takes entries and waits for a core (the replays' verdict,
        dledger/read_pacer.py), at a SCRUB_YIELD_SLOWDOWN-th of that: a pass
        took a sixth of a follower's CPU samples under full send load
        (py-spy, 2026-11-28), work that can wait for a quieter second."""
        if self.config.scrub_bytes_per_s <= 0:
            return
        chunk = max(64 << 10, self.config.scrub_bytes_per_s // 8)
        cursor, pass_end = -1, -1
        pass_started = float("-inf")
        end_seen = -1
        while True:
            end_seen, slow = self._scrub_should_slow(end_seen)
            await asyncio.sleep(chunk / self.config.scrub_bytes_per_s * (SCRUB_YIELD_SLOWDOWN if slow else 1))
            store = self.store
            if cursor < store.ledger_begin_index or cursor > min(pass_end, self._scrub_limit()):
                # A new pass, once the last one is old enough: a small log is
                # not re-read back to back. It covers what is committed when
                # it starts: entries written since were checked on the way in,
                # and a pass that chased a growing log would never end (nor
                # come back to the oldest entries) under writes faster than it.
                wait = pass_started + self.config.scrub_pass_interval_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                pass_started = time.monotonic()
                cursor, pass_end = store.ledger_begin_index, self._scrub_limit()
                if cursor > pass_end:
                    continue
            try:
                cursor, damaged = store.find_damage(cursor, chunk)
            except CorruptLogError as error:
                log.error("%s", error.message)
                damaged = cursor
            except DLedgerError:
                cursor = -1   # the log moved under the cursor (retention, a reset): start over
                continue
            if damaged >= 0:
                self.repair_damage(damaged)
                cursor = -1

    def _scrub_should_slow(self, end_seen: int) -> tuple[int, bool]:
        """(the log's end now, whether the scrubber yields): the replays' rule,
        with "writing" judged since the scrubber's own last look."""
        end = self.store.ledger_end_index
        if self.config.replay_yield_wait_share <= 0 or not self.cpu_contention.available:
            return end, False
        return end, self._yield_verdict(end != end_seen) is Verdict.YIELD

    def _scrub_limit(self) -> int:
        """The last entry the scrubber may check: committed and on disk."""
        store = self.store
        return min(self.member_state.committed_index, store.flushed_index, store.ledger_end_index)

    def repair_damage(self, index: int) -> None:
        """A committed entry failed its check while running: cut the log there
        and repair from the leader as a non-voter, up to everything this node
        may have acknowledged. A leader steps down first."""
        ms, store = self.member_state, self.store
        until = max(store.ledger_end_index, ms.committed_index)
        until_term = store.ledger_end_term
        log.error("entry %d is damaged on this node: cutting the log before it and repairing from the leader "
                  "up to entry %d (until then it counts toward no quorum, never campaigns, and votes only for a "
                  "candidate whose log reaches (term %d, entry %d))", index, until, until_term, until)
        self.repairs += 1
        ms.start_repair(until, until_term)
        if ms.is_leader:
            ms.change_to_candidate()
        store.cut_damaged(index)
        if self.pusher is not None:
            self.pusher.handler.verified_end = min(self.pusher.handler.verified_end, store.ledger_end_index)

    # --------------------------------------------------------- housekeeping
    async def _checkpointer(self) -> None:
        """Checkpoints, producer table snapshots and the disk check, every
        checkpoint interval. A full disk makes the log read-only here, never
        ends the task; the next round tries again."""
        while True:
            await asyncio.sleep(self.config.checkpoint_interval_s)
            self.store.check_disk()
            try:
                await self.store.write_checkpoint_in_background()
                await self._save_producers_in_background()
            except DLedgerError as error:
                if error.code is not ResponseCode.DISK_FULL:
                    raise
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                log.warning("cannot save the producer table: %s", error.strerror)

    async def _save_producers_in_background(self) -> None:
        """Only when the table changed; encoded and written in a thread (the
        loop copies what changed since the last time, nothing more)."""
        assert self.pusher is not None
        captured = self.pusher.producers_snapshot()
        if captured is None:
            return
        applied, encode = captured

        def write() -> Snapshot:
            snapshot = encode()
            write_atomic(self._producers_path, snapshot.chunks())
            return snapshot

        snapshot = await asyncio.to_thread(write)
        self.pusher.producers.keep(snapshot)
        self._producers_snapshot_index = applied

    def _save_producers(self) -> None:
        assert self.pusher is not None
        captured = self.pusher.producers_snapshot()
        if captured is not None:
            snapshot = captured[1]()
            write_atomic(self._producers_path, snapshot.chunks())
            self._producers_snapshot_index = captured[0]

    async def _retention(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_interval_s)
            self.store.check_disk()
            keep_from = self._retention_floor()
            deleted = await self.store.delete_expired_in_background(keep_from, time.time() - self.config.retention_s)
            if deleted:
                log.info("retention deleted %d segment(s); ledger now begins at %d",
                         deleted, self.store.ledger_begin_index)

    def _retention_floor(self) -> int:
        """Never delete what is uncommitted, or what a follower we still hear from lacks."""
        floor = min(self.member_state.committed_index, self._producers_snapshot_index) + 1
        for needed_from in self.retention_floors:
            floor = min(floor, needed_from())
        if self.member_state.role is Role.LEADER and self.elector is not None and self.pusher is not None:
            now = self.clock.now()
            for peer in self.elector.peers:
                live = now - self.elector.last_contact.get(peer, float("-inf")) < self.config.retention_check_interval_s * 6
                if live:
                    floor = min(floor, self.pusher.quorum.watermark(self.member_state.term, peer) + 1)
        return floor


def members_to_pb(membership: Membership) -> list[pb.Member]:
    return [pb.Member(id=m.id, address=m.address, role=m.role, client_address=m.client_address)
            for m in membership.members]


def entry_to_pb(entry: DLedgerEntry) -> pb.Entry:
    return pb.Entry(index=entry.index, term=entry.term, pos=entry.pos, magic=entry.magic, body=entry.body,
                    body_crc=entry.body_crc, chain_crc=entry.chain_crc, channel=entry.channel)

