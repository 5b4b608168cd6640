"""Plain data a node reports about itself (Metadata RPC, metrics, CLI), and the
observer hook through which cluster/ counts events without dledger/ knowing
about Prometheus."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class PeerStatus:
    id: str
    address: str
    watermark: int  # leader only: highest index the peer has on disk (-1 unknown)
    lag: int        # leader only: ledger end index minus watermark
    role: str = "voter"   # "voter" or "learner" in the node's current configuration


@dataclass(frozen=True)
class NodeStatus:
    group: str
    self_id: str
    role: str            # "LEADER" | "FOLLOWER" | "CANDIDATE"
    term: int
    leader_id: str
    leader_address: str
    ledger_begin_index: int
    ledger_end_index: int
    ledger_end_term: int
    committed_index: int
    flushed_index: int
    pending_appends: int
    peers: list[PeerStatus] = field(default_factory=list)
    loop_lag_s: float = 0.0       # the event loop's longest stall in the last 10 s
    loop_stalls: int = 0          # stalls longer than 50 ms since start
    repairing: bool = False       # repairing its log: a non-voter until it holds repair_until
    repair_until: int = -1
    repairs: int = 0              # repairs started by this process
    loop_cpu_wait_share: float = 0.0  # of the loop thread's runnable time now, the part waiting for a core
    replay_pace_bytes_per_s: float = 0.0  # what replays may read now (0: unpaced)


class ServerObserver(Protocol):
    """Called from the event loop; implementations must be cheap and never raise."""

    def on_append(self, latency_s: float, entries: int) -> None: ...
    def on_election(self, term: int) -> None: ...
    def on_role_change(self, role: str, term: int) -> None: ...


class NullObserver:
    def on_append(self, latency_s: float, entries: int) -> None:
        pass

    def on_election(self, term: int) -> None:
        pass

    def on_role_change(self, role: str, term: int) -> None:
        pass
