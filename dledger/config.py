"""DLedgerConfig: every tunable of a node, each default explained once.

Times are in seconds (floats) throughout the code; the names say `_s`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class FlushMode(str, Enum):
    # An entry counts toward the quorum only once it is on disk (fdatasync),
    # on the leader and on every follower. Appends that arrive while one
    # fdatasync runs share the next one (group commit).
    SYNC = "sync"
    # DLedger's own default: count an entry once it is in the page cache and
    # flush every `flush_interval_s`. Faster; a power loss on a majority can
    # lose acknowledged entries.
    ASYNC = "async"


@dataclass(frozen=True)
class PeerAddress:
    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_routes(text: str) -> tuple[tuple[str, str], ...]:
    """`HOST:PORT=HOST:PORT,...` (peer address = where to dial it)."""
    routes: list[tuple[str, str]] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        address, sep, via = item.partition("=")
        for part in (address, via):
            host, colon, port = part.strip().rpartition(":")
            if not sep or not colon or not host or not port.isdigit():
                raise ValueError(f"route {item!r}: expected HOST:PORT=HOST:PORT")
        routes.append((address.strip(), via.strip()))
    return tuple(routes)


def parse_peers(text: str) -> list[PeerAddress]:
    """Parse `n0=127.0.0.1:20911,n1=...` (also DLedger's `n0-host:port;n1-...`)."""
    peers: list[PeerAddress] = []
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            peer_id, address = item.split("=", 1)
        elif "-" in item:
            peer_id, address = item.split("-", 1)
        else:
            raise ValueError(f"peer {item!r}: expected ID=HOST:PORT")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"peer {item!r}: expected ID=HOST:PORT")
        peers.append(PeerAddress(peer_id.strip(), host.strip(), int(port)))
    ids = [p.id for p in peers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate peer ids in {text!r}")
    if not peers:
        raise ValueError("no peers given")
    return peers


@dataclass(frozen=True)
class DLedgerConfig:
    self_id: str
    peers: tuple[PeerAddress, ...]
    data_dir: str
    group: str = "default"

    # ---- election. A follower that hears nothing from its leader for a random
    # time in [election_timeout_min_s, election_timeout_max_s] campaigns. The
    # heartbeat is a fifth of the minimum so that four lost heartbeats in a row
    # are needed for a spurious election; failover lands near 0.5-0.8 s.
    heartbeat_interval_s: float = 0.1
    election_timeout_min_s: float = 0.5
    election_timeout_max_s: float = 1.0
    # How long a vote or heartbeat RPC may take before it counts as lost.
    rpc_timeout_s: float = 1.0
    # Leadership transfer: the transferee may lag at most this many entries,
    # and gets this long to catch up and win (DLedger: 1000 entries, 1 s).
    max_leadership_transfer_wait_index: int = 1000
    leadership_transfer_timeout_s: float = 2.0
    preferred_leader_id: str = ""
    preferred_leader_check_interval_s: float = 1.0

    # ---- replication (DLedgerEntryPusher)
    # Entries per push and bytes per push: large batches keep the per-call
    # cost of Python gRPC (about 0.3 ms) off the per-entry cost.
    max_push_batch_entries: int = 1024
    max_push_batch_bytes: int = 1 << 20
    # In-flight entries per follower before the dispatcher waits (DLedger: 1000 requests).
    max_pending_entries_per_peer: int = 8192
    # In-flight push calls per follower. DLedger sends every entry as soon as it
    # is written; under load that is one RPC per entry. Capping the calls in
    # flight makes entries that arrive meanwhile ride together on the next push
    # (group commit on the wire), which is what keeps Python's per-call cost
    # off the per-entry path.
    max_inflight_pushes_per_peer: int = 2
    # A push with no answer after this is resent from the follower's watermark.
    push_timeout_s: float = 1.0
    # A commit-only push when idle, at most this often (DLedger: 1 s).
    commit_push_interval_s: float = 1.0
    # A follower more than this many entries behind the commit index (one
    # catching up, not one in the quorum) is throttled to a byte quota, while
    # the commit index moved within the last peer_push_throttle_busy_s: the
    # quota keeps a catch-up from starving the leader's writers, and a leader
    # that committed nothing for that long has none (it is idle, or it cannot
    # commit until this follower catches up: a majority that needs a repaired
    # or replaced node waited at 20 MiB/s for it before).
    peer_push_throttle_lag: int = 1000
    peer_push_quota_bytes_per_s: int = 20 << 20
    peer_push_throttle_busy_s: float = 1.0
    # Follower: an out-of-order push waiting for a gap this long fails with
    # INCONSISTENT_STATE so the leader goes back to COMPARE.
    follower_gap_timeout_s: float = 1.0

    # ---- client appends (QuorumAckChecker)
    max_wait_ack_s: float = 2.5           # then WAIT_QUORUM_ACK_TIMEOUT
    max_pending_requests: int = 100_000   # entries awaiting commit; then LEADER_PENDING_FULL
    # A body larger than this is refused: room for a 4 MiB RocketMQ message
    # body plus its headers and up to 32 KiB of properties.
    max_entry_size: int = (4 << 20) + (64 << 10)
    max_append_batch_entries: int = 10_000

    # ---- storage (DLedger's file store)
    data_file_size: int = 1 << 30         # DLedger's default, 1 GiB
    index_file_size: int = 32 * 5 * (1 << 20)  # 160 MiB = 5,242,880 index records
    flush_mode: FlushMode = FlushMode.SYNC
    flush_interval_s: float = 0.01        # ASYNC mode only
    # The checkpoint records the committed index that readers of the files
    # (the Spark replay, recovery) go by; DLedger writes it every 3 s. Written
    # off the event loop, once a second costs one small fsync a second and
    # keeps file-mode streaming within 2 s of a commit.
    checkpoint_interval_s: float = 1.0
    preallocate: bool = True              # posix_fallocate new segments: ENOSPC at roll, not mid-write
    # Retention: segments older than this go, unless a live follower or the
    # commit index still needs them (DLedger: 72 h).
    retention_s: float = 72 * 3600.0
    retention_check_interval_s: float = 10.0
    # A damaged entry at or below the flushed point (found at start-up or by
    # the scrubber) cuts the log and makes the node repair from the leader as
    # a non-voter; False: refuse to start instead (etcd's behaviour).
    repair_damaged_log: bool = True
    # The scrubber re-verifies committed entries (CRCs, chain links) at this
    # rate, a pass at most every scrub_pass_interval_s, so damage is found
    # before anyone needs the entry (0: no scrubbing).
    scrub_bytes_per_s: int = 8 << 20
    scrub_pass_interval_s: float = 60.0
    # Replays (raw committed-range reads: Spark's live reader) yield to the
    # node's own work: while the event loop's thread spends more than this
    # share of its runnable time waiting for a core (and at least
    # replay_yield_min_wait of every second), their rate halves, down to
    # replay_floor_bytes_per_s; without contention it grows back to unpaced
    # (dledger/read_pacer.py, dledger/cpu_contention.py). 0: never paced.
    replay_yield_wait_share: float = 0.35
    replay_yield_min_wait: float = 0.08
    replay_floor_bytes_per_s: int = 2 << 20
    # Idempotent appends: a retry is recognised this long after its first
    # attempt (NATS JetStream's duplicate window); see dledger/producer_table.py.
    producer_window_s: float = 120.0
    disk_full_ratio: float = 0.90         # above this the node refuses appends (DISK_FULL)

    # ---- what clients are told. Where a client should connect to reach node
    # ID, when that differs from the address peers use (Kafka's
    # advertised.listeners): inside docker compose peers talk to `n1:20911`
    # while a client on the host must use the published `127.0.0.1:20912`;
    # behind fault-injection proxies peers use the proxies, clients the node.
    # Nodes missing here advertise their peer address.
    advertised_addresses: tuple[PeerAddress, ...] = ()
    # Where this node's gRPC port binds, when not its own peer address. In a
    # container the peer address (`n1:20911`) resolves to the container's IP
    # on one network; binding 0.0.0.0 keeps the port serving when that IP
    # changes (a network disconnected and connected again) and lets a health
    # check ask 127.0.0.1. Empty: bind the peer address.
    listen_address: str = ""
    # Where this node dials to reach a peer address, when not that address
    # itself: (peer address, address to dial) pairs. The chaos harness puts a
    # fault proxy on every link this way, while every node names the same
    # addresses in --peers and configuration entries carry one address per
    # member (dledger/membership.py).
    peer_routes: tuple[tuple[str, str], ...] = ()
    # The peer link (dledger/rpc/peer_link.py): pushes and heartbeats from a
    # leader on a TCP connection of their own rather than a gRPC stream,
    # served on the host of the gRPC bind address at `peer_link_port` (0: a
    # free port the OS picks; heartbeat answers tell the leader which).
    # Leaders dial it through peer_routes like any peer address.
    peer_link_enabled: bool = True
    peer_link_port: int = 0
    # The client link (dledger/rpc/client_link.py): log clients' appends on a
    # TCP connection of their own rather than an AppendStream, served on the
    # host of the client gRPC port at `client_link_port` (0: a free port the
    # OS picks; AppendStream answers tell clients which). Behind a port
    # mapping (docker) give a fixed port published as itself.
    client_link_enabled: bool = True
    client_link_port: int = 0
    # ---- served on the side, reported in Metadata
    metrics_address: str = ""
    # ---- membership (dledger/membership.py). `peers` is the configuration
    # the group starts from; the log's configuration entries override it.
    # A node started with join=True (a server being added to a running
    # group: --peers names the current members and itself) is not a member
    # of that starting configuration: it neither campaigns nor votes until
    # a leader sends it a log in which it is one.
    join: bool = False

    # ---- transport security (dledger/rpc/tls.py). With a certificate, its
    # key and the cluster CA (all three or none), peers talk mutual TLS on
    # the peer address (`peers`), which then serves members only, and
    # clients get their own TLS port: this node's advertised address, bound
    # at `client_listen_address` when that is set.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    peer_tls_ca_file: str = ""
    client_listen_address: str = ""
    # ---- authentication and ACLs (cluster/security/), enforced on every
    # client-facing call when on. The first super user is `auth_super_user`
    # with the secret held in `auth_super_secret_file`; the rest are created
    # through the log. A request's x-mq-date-time may differ from this
    # node's clock by at most `auth_max_skew_s` (RocketMQ checks none; this
    # bounds replay of a captured signature).
    auth_enabled: bool = False
    auth_super_user: str = "admin"
    auth_super_secret_file: str = ""
    auth_max_skew_s: float = 900.0

    @property
    def self_peer(self) -> PeerAddress:
        for p in self.peers:
            if p.id == self.self_id:
                return p
        raise ValueError(f"self id {self.self_id!r} is not among the peers")

    @property
    def peer_ids(self) -> list[str]:
        return [p.id for p in self.peers]

    @property
    def quorum(self) -> int:
        return len(self.peers) // 2 + 1

    def address_of(self, peer_id: str) -> str:
        for p in self.peers:
            if p.id == peer_id:
                return p.address
        return ""

    def client_address_of(self, peer_id: str) -> str:
        """The address a client should use for node `peer_id`."""
        for p in self.advertised_addresses:
            if p.id == peer_id:
                return p.address
        return self.address_of(peer_id)

    def dial_address(self, address: str) -> str:
        """The address to connect to for peer address `address` (peer_routes)."""
        for peer_address, via in self.peer_routes:
            if peer_address == address:
                return via
        return address

    @property
    def mutual_tls(self) -> bool:
        """Peers on their own mutual-TLS port, clients on another."""
        return bool(self.tls_cert_file and self.peer_tls_ca_file)

    @property
    def client_bind_address(self) -> str:
        """With mutual TLS, where the client port listens."""
        return self.client_listen_address or self.client_address_of(self.self_id)

    @property
    def bind_address(self) -> str:
        """The HOST:PORT the gRPC server listens on."""
        return self.listen_address or self.self_peer.address

    def validate(self) -> None:
        self.self_peer  # raises when missing
        if self.listen_address:
            host, sep, port = self.listen_address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"listen_address {self.listen_address!r}: expected HOST:PORT")
        if not (0 < self.election_timeout_min_s <= self.election_timeout_max_s):
            raise ValueError("need 0 < election_timeout_min_s <= election_timeout_max_s")
        if self.heartbeat_interval_s * 2 > self.election_timeout_min_s:
            raise ValueError("heartbeat interval must be at most half the minimum election timeout")
        if self.max_entry_size + 64 > self.data_file_size:
            raise ValueError("max_entry_size must fit in one data file")
        if self.index_file_size % 32:
            raise ValueError("index_file_size must be a multiple of 32")
        if self.peer_push_quota_bytes_per_s <= 0:
            # A zero quota would starve a far-behind follower for as long as writes commit.
            raise ValueError("peer_push_quota_bytes_per_s must be positive")
        if not 0 <= self.replay_yield_wait_share < 1 or self.replay_yield_min_wait < 0:
            raise ValueError("replay_yield_wait_share must be in [0, 1) (0: replays never yield) and "
                             "replay_yield_min_wait at least 0")
        if self.replay_floor_bytes_per_s <= 0:
            raise ValueError("replay_floor_bytes_per_s must be positive: a paced replay must still progress")
        if self.mutual_tls and self.client_bind_address == self.bind_address:
            raise ValueError("mutual TLS between peers needs a separate client port: give advertised_addresses "
                             "(where clients reach each node) and, if needed, client_listen_address")
        if self.peer_link_port >= 65536:
            raise ValueError(f"peer_link_port {self.peer_link_port}: expected 0 (any free port) or 1..65535")
        if not 0 <= self.client_link_port < 65536:
            raise ValueError(f"client_link_port {self.client_link_port}: expected 0 (any free port) or 1..65535")
        if self.auth_enabled and not self.auth_super_secret_file:
            raise ValueError("auth_enabled needs auth_super_secret_file (the first super user's secret)")
        unknown = {p.id for p in self.advertised_addresses} - set(self.peer_ids)
        if unknown:
            raise ValueError(f"advertised addresses for unknown nodes: {', '.join(sorted(unknown))}")

