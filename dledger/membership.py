"""Membership: who is in the group, and how that changes online.

A `Membership` is a value: every member's id, peer address and role (a
VOTER counts in elections and quorums; a LEARNER receives the log and counts
in nothing). `config.peers` is only the *starting* configuration, used while
the log holds no configuration entry.

Changes are log entries (magic MAGIC_CONFIG_CHANGE, reserved by DLedger) whose
body is the whole new configuration as JSON, applied one server at a time
(Raft thesis §4.1): two configurations that differ by one server have
overlapping majorities, so no joint consensus is needed. The rules:

- A node uses the LATEST configuration entry in its log, committed or not,
  from the moment it is appended (leader and followers alike). A truncate
  that drops a configuration entry reverts to the one before it, so the
  history of (index, configuration) is kept for every entry in the log.
- The leader accepts a change only when no other change is uncommitted and
  its own term has a committed entry (the NOOP), and only one server
  differs. A new server joins as a learner; the leader promotes it to voter
  with a second entry once it has caught up.
- A move gives a member a new address under its id and role (its machine
  was replaced): the voters do not change, so it is a change of no server
  at all as far as majorities go. The server at the new address is a new
  *incarnation* of the member (it may hold nothing yet, and counts once it
  has caught up, as any node with a new disk); vote requests from an
  earlier incarnation are refused, so the old process, should it come
  back, cannot vote a second time under the same id.

`MembershipLog` follows the store: the store calls it when a configuration
entry is written and when a truncate drops entries; the commit index folds
committed configurations into a small snapshot file (`membership`), which is
where a restart begins before it scans the log after it.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from dledger.config import DLedgerConfig, PeerAddress
from dledger.errors import DLedgerError, ResponseCode
from dledger.store.properties import write_atomic

log = logging.getLogger(__name__)

VOTER = "voter"
LEARNER = "learner"
ROLES = (VOTER, LEARNER)

# A learner is promoted once its acknowledged index is within this many
# entries of the leader's end (or at the leader's commit index): close enough
# that counting it cannot stall commits while it catches up the rest.
PROMOTION_GAP_ENTRIES = 100


@dataclass(frozen=True)
class Member:
    id: str
    address: str
    role: str = VOTER
    # Where clients reach it, when not at `address` (given to `member add`
    # under mutual TLS, where peers have ports of their own); "": `address`.
    client_address: str = ""
    # Raised each time the member is moved to a new address: the server
    # there is a new one under the same id, and a vote request from an
    # earlier incarnation (the old process, should it still run) is refused.
    incarnation: int = 0

    @property
    def is_voter(self) -> bool:
        return self.role == VOTER


@dataclass(frozen=True)
class Membership:
    members: tuple[Member, ...]

    @classmethod
    def bootstrap(cls, peers: Iterable[PeerAddress], exclude: str = "") -> "Membership":
        return cls(tuple(Member(p.id, p.address) for p in peers if p.id != exclude))

    # ------------------------------------------------------------- queries
    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.members]

    @property
    def voters(self) -> list[str]:
        return [m.id for m in self.members if m.is_voter]

    @property
    def learners(self) -> list[str]:
        return [m.id for m in self.members if not m.is_voter]

    @property
    def quorum(self) -> int:
        """A majority of the voters."""
        return len(self.voters) // 2 + 1

    def get(self, member_id: str) -> Member | None:
        for m in self.members:
            if m.id == member_id:
                return m
        return None

    def is_voter(self, member_id: str) -> bool:
        member = self.get(member_id)
        return member is not None and member.is_voter

    def address_of(self, member_id: str) -> str:
        member = self.get(member_id)
        return member.address if member else ""

    # ------------------------------------------------------------- changes
    def with_learner(self, member_id: str, address: str, client_address: str = "") -> "Membership":
        return Membership(self.members + (Member(member_id, address, LEARNER, client_address),))

    def promoted(self, member_id: str) -> "Membership":
        return Membership(tuple(replace(m, role=VOTER) if m.id == member_id else m for m in self.members))

    def moved(self, member_id: str, address: str, client_address: str | None = None) -> "Membership":
        """`client_address` None keeps the member's own."""
        def move(m: Member) -> Member:
            return replace(m, address=address, incarnation=m.incarnation + 1,
                           client_address=m.client_address if client_address is None else client_address)
        return Membership(tuple(move(m) if m.id == member_id else m for m in self.members))

    def incarnation_of(self, member_id: str) -> int:
        member = self.get(member_id)
        return member.incarnation if member else 0

    def without(self, member_id: str) -> "Membership":
        return Membership(tuple(m for m in self.members if m.id != member_id))

    # -------------------------------------------------------------- codec
    def to_json(self) -> bytes:
        return json.dumps({"members": [_member_json(m) for m in self.members]}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> "Membership":
        value = json.loads(data)
        members = tuple(Member(str(m["id"]), str(m["address"]), str(m.get("role", VOTER)),
                               str(m.get("clientAddress", "")), int(m.get("incarnation", 0)))
                        for m in value["members"])
        for m in members:
            if m.role not in ROLES:
                raise ValueError(f"member {m.id!r}: unknown role {m.role!r}")
        return cls(members)

    def client_address_of(self, member_id: str) -> str:
        """The client address `member add` was given for it ("" if none)."""
        member = self.get(member_id)
        return member.client_address if member else ""

    def describe(self) -> str:
        return ", ".join(f"{m.id}={m.address}{'' if m.is_voter else ' (learner)'}" for m in self.members)


# ---------------------------------------------------------------- decisions

def check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"address {address!r}: expected HOST:PORT")


def _check_addresses(member_id: str, address: str, client_address: str, separate_client_port: bool,
                     command: str) -> None:
    """A member's peer and client addresses are HOST:PORT; when the group's
    peers talk mutual TLS on ports of their own, clients cannot use the peer
    port, so the client address is required."""
    check_address(address)
    if client_address:
        check_address(client_address)
    elif separate_client_port:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"this group's peers talk mutual TLS on ports of their own, which clients cannot use: "
                           f"give {member_id}'s client address too ({command} --client-address HOST:PORT)")


def plan_add(current: Membership, member_id: str, address: str, client_address: str = "",
             separate_client_port: bool = False) -> Membership | None:
    """The configuration that adds `member_id` as a learner; None when it is
    already a member at that address (a retried request: nothing to do).
    `separate_client_port`: the group's peers talk mutual TLS on ports of
    their own, so clients need the new member's client address."""
    if not member_id or any(c in member_id for c in ",=; "):
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"member id {member_id!r} is not a valid id")
    _check_addresses(member_id, address, client_address, separate_client_port, "dledger member add")
    existing = current.get(member_id)
    if existing is not None:
        if existing.address == address and existing.client_address == client_address:
            return None
        raise DLedgerError(ResponseCode.UNEXPECTED_MEMBER,
                           f"{member_id} is already a member at {existing.address}; remove it first to move it")
    for m in current.members:
        if m.address == address:
            raise DLedgerError(ResponseCode.UNEXPECTED_MEMBER, f"{m.id} already uses the address {address}")
    return current.with_learner(member_id, address, client_address)


def plan_move(current: Membership, member_id: str, address: str, leader_id: str,
              heard_from_s: float | None, silent_needed_s: float, client_address: str = "",
              separate_client_port: bool = False) -> Membership | None:
    """The configuration that gives `member_id` a new address (same id, same
    role, a new incarnation); None when it is already there (a retry).
    `heard_from_s`: how long ago the leader last heard from it (None: never
    in this term). A member that still answers at its old address is not
    moved: two processes under one id could each vote once in a term.
    `client_address`: where clients reach it now (required when the peers
    talk mutual TLS on ports of their own, as for an added member)."""
    _check_addresses(member_id, address, client_address, separate_client_port, "dledger member replace")
    member = current.get(member_id)
    if member is None:
        raise DLedgerError(ResponseCode.UNKNOWN_MEMBER,
                           f"{member_id!r} is not a member (members: {', '.join(current.ids)}); add it instead")
    if member.address == address and client_address in ("", member.client_address):
        return None
    for m in current.members:
        if m.address == address:
            raise DLedgerError(ResponseCode.UNEXPECTED_MEMBER, f"{m.id} already uses the address {address}")
    if member_id == leader_id:
        raise DLedgerError(ResponseCode.UNEXPECTED_MEMBER,
                           f"{member_id} is the leader: transfer leadership to another voter, stop {member_id}, "
                           f"then move it")
    if heard_from_s is not None and heard_from_s < silent_needed_s:
        raise DLedgerError(ResponseCode.ILLEGAL_MEMBER_STATE,
                           f"{member_id} still answers at {member.address} (last heard {heard_from_s:.1f} s ago): "
                           f"stop it before moving it, or it would run twice under one id")
    return current.moved(member_id, address, client_address or None)


def plan_remove(current: Membership, member_id: str) -> Membership:
    member = current.get(member_id)
    if member is None:
        raise DLedgerError(ResponseCode.UNKNOWN_MEMBER,
                           f"{member_id!r} is not a member (members: {', '.join(current.ids)})")
    if member.is_voter and len(current.voters) == 1:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{member_id} is the last voter; it cannot be removed")
    return current.without(member_id)


def check_can_change(change_pending_at: int, leader_ready: bool) -> None:
    """The leader's preconditions for any configuration change."""
    if not leader_ready:
        raise DLedgerError(ResponseCode.LEADER_NOT_READY,
                           "a new leader changes the membership once an entry of its term is committed")
    if change_pending_at >= 0:
        raise DLedgerError(ResponseCode.MEMBERSHIP_CHANGE_IN_PROGRESS,
                           f"the membership change at index {change_pending_at} is not committed yet; "
                           f"one change at a time")


def learner_to_promote(current: Membership, acked: Callable[[str], int], leader_end: int,
                       leader_committed: int) -> str | None:
    """A learner that has caught up (within PROMOTION_GAP_ENTRIES of the
    leader's end, or at its commit index), or None."""
    for member_id in current.learners:
        mark = acked(member_id)
        if mark >= 0 and (leader_end - mark <= PROMOTION_GAP_ENTRIES or mark >= leader_committed):
            return member_id
    return None


# ------------------------------------------------------------------ the log

class MembershipLog:
    """The configurations in this node's log, newest last, over the last
    committed one (persisted in `membership` next to the log)."""

    def __init__(self, config: DLedgerConfig, base_dir: str) -> None:
        self.config = config
        self.path = os.path.join(base_dir, "membership")
        # A node started with --join is not a member of the configuration it
        # starts from: it waits (neither campaigns nor votes) until a leader
        # sends it a log in which it is one.
        self.bootstrap = Membership.bootstrap(config.peers, exclude=config.self_id if config.join else "")
        self.committed_index = -1                 # index of the committed configuration entry, -1 bootstrap
        self.committed = self.bootstrap
        self.history: list[tuple[int, Membership]] = []   # uncommitted entries, index order
        self.listeners: list[Callable[[Membership], None]] = []

    @property
    def current(self) -> Membership:
        return self.history[-1][1] if self.history else self.committed

    @property
    def pending_index(self) -> int:
        """The index of the newest uncommitted configuration entry, or -1."""
        return self.history[-1][0] if self.history else -1

    def known_ids(self) -> set[str]:
        """Every node this one may hear from: members of any configuration it
        holds, and the starting peers."""
        ids = set(self.committed.ids) | {p.id for p in self.config.peers}
        for _, membership in self.history:
            ids |= set(membership.ids)
        return ids

    def replication_targets(self) -> list[str]:
        """Who a leader sends the log to: every member of the configurations
        it holds (a removed server keeps getting the log until its removal
        commits, so it learns of it), except itself."""
        ids = dict.fromkeys(self.committed.ids)
        for _, membership in self.history:
            ids.update(dict.fromkeys(membership.ids))
        return [i for i in ids if i != self.config.self_id]

    def incarnation_of(self, member_id: str) -> int:
        """The member's incarnation in the newest configuration that names it."""
        for _, membership in reversed(self.history):
            if membership.get(member_id):
                return membership.incarnation_of(member_id)
        return self.committed.incarnation_of(member_id)

    def address_of(self, member_id: str) -> str:
        for _, membership in reversed(self.history):
            if membership.get(member_id):
                return membership.address_of(member_id)
        return self.committed.address_of(member_id) or self.config.address_of(member_id)

    # ------------------------------------------------------------ loading
    def load(self, scan: Callable[[int], list[tuple[int, bytes]]]) -> None:
        """The snapshot, then every configuration entry after it in the log
        (`scan(after_index)` returns (index, body) of those entries)."""
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as file:
                saved = json.load(file)
            self.committed_index = int(saved["index"])
            self.committed = Membership.from_json(json.dumps(saved))
            if self.committed_index < 0 and self.committed != self.bootstrap:
                log.warning("--peers (%s) is not the configuration this node started with (%s): it is ignored; "
                            "members change with `dledger member`", self.bootstrap.describe(),
                            self.committed.describe())
        else:
            # The first start of this data directory (or of one from before
            # the file held the starting configuration): keep what --peers
            # says now, so that later --peers cannot change it. Otherwise
            # nodes restarted with different --peers before any change has
            # committed disagree on who the members are.
            self._save()
        for index, body in scan(self.committed_index):
            self._add(index, body)
        log.info("membership: %s%s", self.current.describe(),
                 f" (uncommitted, at {self.pending_index})" if self.history else "")

    # ------------------------------------------------- store notifications
    def appended(self, index: int, body: bytes) -> None:
        """A configuration entry was written at `index`: it takes effect now."""
        before = self.current
        self._add(index, body)
        if self.current != before:
            log.info("membership at %d: %s", index, self.current.describe())
            self._notify()

    def _add(self, index: int, body: bytes) -> None:
        if index <= self.committed_index or (self.history and index <= self.history[-1][0]):
            return
        try:
            membership = Membership.from_json(body)
        except (ValueError, KeyError, TypeError) as error:
            log.error("configuration entry %d is unreadable (%s); ignored", index, error)
            return
        self.history.append((index, membership))

    def truncated(self, last_kept_index: int) -> None:
        """Entries after `last_kept_index` are gone: so are their configurations."""
        if not self.history or self.history[-1][0] <= last_kept_index:
            return
        self.history = [(i, m) for i, m in self.history if i <= last_kept_index]
        log.info("configuration entries after %d were truncated; membership reverts to %s",
                 last_kept_index, self.current.describe())
        self._notify()

    def install(self, index: int, body: bytes) -> None:
        """A leader reset this follower's log: take its committed
        configuration (the entries before the new begin are not coming)."""
        try:
            membership = Membership.from_json(body)
        except (ValueError, KeyError, TypeError) as error:
            log.error("the leader's configuration at %d is unreadable (%s); ignored", index, error)
            return
        self.committed_index, self.committed, self.history = index, membership, []
        self._save()
        log.info("membership from the leader (committed at %d): %s", index, membership.describe())
        self._notify()

    def commit(self, committed_index: int) -> None:
        """Fold configurations at or below the commit index into the snapshot."""
        if not self.history or self.history[0][0] > committed_index:
            return
        while self.history and self.history[0][0] <= committed_index:
            self.committed_index, self.committed = self.history.pop(0)
        self._save()
        self._notify()

    def _save(self) -> None:
        saved = json.loads(self.committed.to_json())
        saved["index"] = self.committed_index
        write_atomic(self.path, json.dumps(saved).encode())

    def _notify(self) -> None:
        for listener in self.listeners:
            listener(self.current)


def _member_json(member: Member) -> dict[str, object]:
    """A member as configuration entries hold it. "clientAddress" and
    "incarnation" only when set: until then the entries stay what earlier
    versions wrote (and read)."""
    data: dict[str, object] = {"id": member.id, "address": member.address, "role": member.role}
    if member.client_address:
        data["clientAddress"] = member.client_address
    if member.incarnation:
        data["incarnation"] = member.incarnation
    return data
