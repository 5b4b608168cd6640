"""ClientConfig: the client's tunables, each default explained once."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from dledger.client import parse_servers
from dledger.rpc.credentials import ClientSecurity


@dataclass(frozen=True)
class ClientConfig:
    # Any nodes of the cluster ("host:port,host:port" or a list). The client
    # finds the leader among them and talks to it; any node would serve it
    # (followers forward), but a forwarded call costs the cluster a hop.
    servers: tuple[str, ...]
    # Name servers (host:port) to look routes up from, before asking the
    # servers; empty: routes come from the servers (any node answers for
    # every broker group).
    namesrv_addrs: tuple[str, ...] = ()
    # RocketMQ's namespace, sent as x-mq-namespace and in every Resource.
    namespace: str = ""
    # One attempt of a unary call. Longer than the broker's commit wait
    # (max_wait_ack 2.5 s), so a slow commit is answered by the broker.
    request_timeout_s: float = 5.0
    # All attempts of one call together: past this a retriable failure is
    # raised. Long enough to outlast a leader election under load.
    deadline_s: float = 15.0
    # Keep-alive (the official clients: every 10 s); also when the client
    # checks that its Telemetry stream still goes to the leader.
    heartbeat_interval_s: float = 10.0
    # How long a leader discovery waits for each node's Metadata answer.
    probe_timeout_s: float = 1.0
    # A call to the leader unanswered this long (a long poll: twice this)
    # makes the client ask the other nodes whether the leader moved, and try
    # it again at the new one if so (broker/client/watchdog.py): a paused
    # leader then costs about an election, not the call's timeout. 0: never.
    leader_check_after_s: float = 0.5
    # Retry backoff: jittered, from this, doubling to the max.
    retry_initial_s: float = 0.02
    retry_max_s: float = 0.5
    # Sends, receives and acks on each node's messaging link (a framed TCP
    # connection, broker/client/link.py) once one is open, instead of gRPC
    # calls: the same answers at less CPU per call. False: gRPC only.
    links: bool = True
    # Extra gRPC channel options (name, value).
    channel_options: tuple[tuple[str, object], ...] = field(default_factory=tuple)
    # Credentials (RocketMQ 5's request signature) and the CA to trust (TLS).
    # None: from DLEDGER_USER, DLEDGER_SECRET_FILE and DLEDGER_TLS_CA.
    security: ClientSecurity | None = None

    @classmethod
    def of(cls, servers: "str | Iterable[str] | ClientConfig", **overrides: object) -> "ClientConfig":
        """A config from a server list (or a config, with overrides)."""
        if isinstance(servers, ClientConfig):
            return servers if not overrides else cls(**{**servers.__dict__, **overrides})  # type: ignore[arg-type]
        return cls(servers=tuple(parse_servers(servers)), **overrides)  # type: ignore[arg-type]
