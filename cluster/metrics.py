"""Prometheus metrics of one node.

Two sources: events the server reports through the ServerObserver hook
(elections, appends and their latency) become counters and a histogram, and
the state the server already keeps (term, role, indexes, per-peer
watermarks) is read from `server.status()` at scrape time by a Collector, so
that nothing on the hot path updates a gauge.

Each node gets its own CollectorRegistry rather than the process-global one,
so that tests can run several nodes in one process.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster.console.backend import Target
from cluster.console.server import ConsoleHttpServer, start_console_server, stop_console_server
from cluster.raw_read_http import RawReadEndpoint
from dledger.rpc.credentials import ClientSecurity
from dledger.status import NodeStatus

if TYPE_CHECKING:
    from broker.messaging_link import MessagingLinks
    from dledger.rpc.client_link import ClientLinkServer
    from dledger.rpc.peer_client import GrpcTransport
    from store.hot_messages import HotMessages

log = logging.getLogger(__name__)

ROLES = ("LEADER", "FOLLOWER", "CANDIDATE")
# From a quarter of a millisecond (a batched append on an idle loopback
# cluster) to the seconds of a failover.
APPEND_LATENCY_BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                          0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A scrape that cannot get the loop's attention within this long gives up on
# the state gauges rather than hanging the scraper.
STATUS_READ_TIMEOUT_S = 1.0


class MetricsObserver:
    """The ServerObserver that counts events; cheap and never raises."""

    def __init__(self, registry: CollectorRegistry, group: str, self_id: str) -> None:
        labels = ("group", "self_id")
        self.elections = Counter(
            "dledger_elections", "Elections this node started as a candidate",
            labels, registry=registry).labels(group, self_id)
        self.appended_entries = Counter(
            "dledger_appended_entries", "Entries appended by clients and committed on this leader",
            labels, registry=registry).labels(group, self_id)
        self.append_latency = Histogram(
            "dledger_append_latency_seconds", "Time from an append's arrival to its commit",
            labels, registry=registry, buckets=APPEND_LATENCY_BUCKETS).labels(group, self_id)

    def on_append(self, latency_s: float, entries: int) -> None:
        self.append_latency.observe(latency_s)
        self.appended_entries.inc(entries)

    def on_election(self, term: int) -> None:
        self.elections.inc()

    def on_role_change(self, role: str, term: int) -> None:
        # The role gauge is read from status() at scrape time; nothing to count.
        pass


class StatusCollector(Collector):
    """Gauges read from `status()` at scrape time."""

    def __init__(self, status: Callable[[], NodeStatus], group: str, self_id: str,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._status = status
        self._labels = [group, self_id]
        # The server's state belongs to its event loop; the HTTP server scrapes
        # from its own thread, so the read is handed to the loop.
        self._loop = loop

    def describe(self) -> Iterable[Metric]:
        # Lets register() check names without calling status() before the
        # server has started.
        return self._families()

    def collect(self) -> Iterable[Metric]:
        try:
            status = self._read_status()
        except Exception as error:  # a scrape must not break on a starting or stopping node
            log.warning("metrics: cannot read node status: %s", error)
            return []
        return self._families(status)

    def _read_status(self) -> NodeStatus:
        loop = self._loop
        if loop is None or not loop.is_running() or _in_loop_thread(loop):
            return self._status()

        async def read() -> NodeStatus:
            return self._status()

        return asyncio.run_coroutine_threadsafe(read(), loop).result(STATUS_READ_TIMEOUT_S)

    def _families(self, status: NodeStatus | None = None) -> list[Metric]:
        labels = ["group", "self_id"]
        simple = {
            "dledger_term": ("Current term", lambda s: s.term),
            "dledger_ledger_begin_index": ("First index held in the log", lambda s: s.ledger_begin_index),
            "dledger_ledger_end_index": ("Last index held in the log", lambda s: s.ledger_end_index),
            "dledger_committed_index": ("Highest committed index known", lambda s: s.committed_index),
            "dledger_flushed_index": ("Highest index on this node's disk", lambda s: s.flushed_index),
            "dledger_pending_appends": ("Client appends waiting for a quorum", lambda s: s.pending_appends),
            "dledger_event_loop_lag_seconds": ("The event loop's longest stall in the last 10 s",
                                               lambda s: s.loop_lag_s),
            "dledger_event_loop_cpu_wait_share": ("Of the event loop thread's runnable time (last 0.3 s), the "
                                                  "share spent waiting for a core", lambda s: s.loop_cpu_wait_share),
            "dledger_replay_pace_bytes_per_second": ("What replays (raw reads) may read now; 0: unpaced",
                                                     lambda s: s.replay_pace_bytes_per_s),
            "dledger_event_loop_stalls": ("Event loop stalls longer than 50 ms since start", lambda s: s.loop_stalls),
            "dledger_repairing": ("1 while the node repairs its log (a non-voter)", lambda s: int(s.repairing)),
            "dledger_repair_until": ("The index a repairing node must hold again (-1: none)",
                                     lambda s: s.repair_until),
            "dledger_repairs": ("Repairs this process started (damaged entries found)", lambda s: s.repairs),
        }
        families: list[Metric] = []
        for name, (help_text, read) in simple.items():
            family = GaugeMetricFamily(name, help_text, labels=labels)
            if status is not None:
                family.add_metric(self._labels, read(status))
            families.append(family)
        role = GaugeMetricFamily("dledger_role", "1 for the node's current role, 0 for the others",
                                 labels=labels + ["role"])
        watermark = GaugeMetricFamily("dledger_peer_watermark",
                                      "Leader only: highest index each peer has on disk",
                                      labels=labels + ["peer"])
        lag = GaugeMetricFamily("dledger_peer_lag", "Leader only: entries each peer is behind",
                                labels=labels + ["peer"])
        if status is not None:
            for name in ROLES:
                role.add_metric(self._labels + [name], 1 if status.role == name else 0)
            for peer in status.peers:
                watermark.add_metric(self._labels + [peer.id], peer.watermark)
                lag.add_metric(self._labels + [peer.id], peer.lag)
        return families + [role, watermark, lag]


def _in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class ForwardingCollector(Collector):
    """A follower's forwarding to the leader, read at scrape time (plain
    counters the forwarder keeps): calls relayed and the relay messages that
    carried them (their ratio is the relay's batching), and forwarded calls
    abandoned because the leader moved."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]], group: str, self_id: str) -> None:
        self._counts = counts
        self._labels = [group, self_id]

    def collect(self) -> Iterable[Metric]:
        calls, messages, abandoned = self._counts()
        for name, help_text, value in (
                ("dledger_relay_calls", "Forwarded unary calls sent on the relay stream to the leader", calls),
                ("dledger_relay_messages", "Relay stream messages that carried them", messages),
                ("dledger_forwarded_calls_abandoned", "Forwarded calls given up because the leader moved",
                 abandoned)):
            family = CounterMetricFamily(name, help_text, labels=["group", "self_id"])
            family.add_metric(self._labels, value)
            yield family


class PeerPathCollector(Collector):
    """The pushes and heartbeats this node sent as leader, by the path they
    took: its peer links, PeerStream (a peer that offers no link, or whose
    link cannot be dialed), unary calls (a peer of an older version); and
    its peer links: open now, dials by outcome."""

    def __init__(self, transport: GrpcTransport, group: str, self_id: str) -> None:
        self._transport = transport
        self._labels = [group, self_id]

    def collect(self) -> Iterable[Metric]:
        transport = self._transport
        paths = CounterMetricFamily("dledger_peer_requests", "Pushes and heartbeats sent to peers, by path",
                                    labels=["group", "self_id", "path"])
        for path, value in sorted(transport.requests_by_path.items()):
            paths.add_metric(self._labels + [path], value)
        yield paths
        dials = CounterMetricFamily("dledger_peer_link_dials", "Peer links dialed, by outcome (refused: another "
                                    "group or wrong credentials)", labels=["group", "self_id", "outcome"])
        for outcome, value in sorted(transport.link_dials.items()):
            dials.add_metric(self._labels + [outcome], value)
        yield dials
        links = GaugeMetricFamily("dledger_peer_links_open", "Peer links this node holds open to followers",
                                  labels=["group", "self_id"])
        links.add_metric(self._labels, transport.open_links)
        yield links


class ClientLinkCollector(Collector):
    """Log clients' links to this node: open now, and the AppendStream
    messages answered on them."""

    def __init__(self, links: ClientLinkServer, group: str, self_id: str) -> None:
        self._links = links
        self._labels = [group, self_id]

    def collect(self) -> Iterable[Metric]:
        open_links = GaugeMetricFamily("dledger_client_links_open", "Log clients' links open to this node",
                                       labels=["group", "self_id"])
        open_links.add_metric(self._labels, len(self._links.connections))
        yield open_links
        appends = CounterMetricFamily("dledger_client_link_appends", "Append messages answered on client links",
                                      labels=["group", "self_id"])
        appends.add_metric(self._labels, self._links.appends)
        yield appends


class MessagingLinkCollector(Collector):
    """Our broker client's calls answered on messaging links."""

    def __init__(self, links: MessagingLinks, group: str, self_id: str) -> None:
        self._links = links
        self._labels = [group, self_id]

    def collect(self) -> Iterable[Metric]:
        calls = CounterMetricFamily("dledger_messaging_link_calls", "Messaging calls answered on client links "
                                    "(broker/messaging_link.py)", labels=["group", "self_id"])
        calls.add_metric(self._labels, self._links.calls)
        yield calls


class HotMessagesCollector(Collector):
    """The leader's decoded newest messages (store/hot_messages.py)."""

    def __init__(self, hot: HotMessages, group: str, self_id: str) -> None:
        self._hot = hot
        self._labels = [group, self_id]

    def collect(self) -> Iterable[Metric]:
        reads = CounterMetricFamily("dledger_hot_message_reads", "Message reads served from the leader's hot "
                                    "messages (hit) or from the log (miss)", labels=["group", "self_id", "outcome"])
        reads.add_metric([*self._labels, "hit"], self._hot.hits)
        reads.add_metric([*self._labels, "miss"], self._hot.misses)
        yield reads
        held = GaugeMetricFamily("dledger_hot_message_bytes", "Stored size of the messages held decoded",
                                 labels=["group", "self_id"])
        held.add_metric(self._labels, self._hot.held_bytes)
        yield held


class NodeMetrics:
    """One node's registry, observer and (optionally) HTTP endpoint.

    The observer must exist before the server (it is a constructor argument)
    and the collector needs the server, hence `bind` after construction.
    """

    def __init__(self, group: str, self_id: str) -> None:
        self.group = group
        self.self_id = self_id
        self.registry = CollectorRegistry()
        self.observer = MetricsObserver(self.registry, group, self_id)
        # Registrations of this node's group with the name servers (broker groups).
        registrations = Counter("dledger_namesrv_registrations_sent", "Registrations of the group this node sent "
                                "to a name server, by outcome", ("group", "self_id", "outcome"),
                                registry=self.registry)
        self._registrations_ok = registrations.labels(group, self_id, "ok")
        self._registrations_failed = registrations.labels(group, self_id, "failed")
        # Audit: refused calls by reason (missing, malformed, unknown_user,
        # bad_signature, stale, forbidden) and RPC; never who or with what secret.
        self.auth_denied = Counter("dledger_auth_denied", "Calls refused by authentication or ACLs",
                                   ("group", "self_id", "reason", "rpc"), registry=self.registry)
        # Runs sent from the files over the metrics port (cluster/raw_read_http.py).
        self._raw_read_bytes = Counter("dledger_raw_http_read_bytes", "Entry bytes of committed runs sent over "
                                       "HTTP with sendfile (Spark's live reads)", ("group", "self_id"),
                                       registry=self.registry).labels(group, self_id)
        self._http: tuple[object, threading.Thread] | None = None

    def on_raw_run_sent(self, length: int) -> None:
        self._raw_read_bytes.inc(length)

    def on_registration(self, ok: bool) -> None:
        (self._registrations_ok if ok else self._registrations_failed).inc()

    def bind(self, status: Callable[[], NodeStatus],
             loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.registry.register(StatusCollector(status, self.group, self.self_id, loop))

    def bind_peer_transport(self, transport: GrpcTransport) -> None:
        self.registry.register(PeerPathCollector(transport, self.group, self.self_id))

    def bind_client_links(self, links: ClientLinkServer) -> None:
        self.registry.register(ClientLinkCollector(links, self.group, self.self_id))

    def bind_messaging_links(self, links: MessagingLinks) -> None:
        self.registry.register(MessagingLinkCollector(links, self.group, self.self_id))

    def bind_hot_messages(self, hot: HotMessages) -> None:
        self.registry.register(HotMessagesCollector(hot, self.group, self.self_id))

    def bind_forwarding(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self.registry.register(ForwardingCollector(counts, self.group, self.self_id))

    def on_auth_denied(self, reason: str, rpc: str) -> None:
        self.auth_denied.labels(self.group, self.self_id, reason, rpc).inc()

    def serve(self, address: str) -> None:
        """Serve /metrics on `address` (host:port) from a daemon thread."""
        host, _, port = address.rpartition(":")
        self._http = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)

    def serve_with_console(self, address: str, console: Target, security: ClientSecurity | None = None,
                           sign_in: bool = False, raw_reads: RawReadEndpoint | None = None) -> None:
        """`serve`, plus the web console on the same port (cluster/console/),
        reading the cluster through `console` (the node's own client address,
        over TLS trusting `security`'s CA; with `sign_in` as the page's user),
        and the node's raw reads for Spark (cluster/raw_read_http.py)."""
        self._http = start_console_server(address, console, self.registry, security, sign_in, raw_reads)

    def close(self) -> None:
        if self._http is not None:
            server, thread = self._http
            if isinstance(server, ConsoleHttpServer):
                stop_console_server(server, thread)
                self._http = None
                return
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=2.0)
            self._http = None
