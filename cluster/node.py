"""Run one DLedger node: the server, its gRPC endpoint, health and metrics.

This is the only place that opens a node's ports. Start-up order: the
server recovers its log and starts its tasks, then the gRPC port opens, then
health says SERVING. Shut-down runs the other way: NOT_SERVING (so that load
balancers and `grpc_health_probe` stop sending), gRPC stops with a grace
period for calls in flight, the server stops its tasks, the peer transport
closes.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from typing import Any, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.admin_service import add_admin_service
from broker.broker import Broker
from broker.config import BrokerConfig
from broker.messaging_link import SERVICE as MESSAGING_LINK
from broker.messaging_link import MessagingLinks
from broker.relay import RelayedHandlers, RelayServicer
from broker.service import MessagingServicer
from cluster.console.backend import Target
from cluster.event_loop import loop_name
from cluster.front_end import FrontEnd
from cluster.raw_read_http import RawReadEndpoint
from cluster.metrics import NodeMetrics
from dledger.tasks import set_crash_handler
from dledger.config import DLedgerConfig
from dledger.rpc import tls
from dledger.rpc.peer_client import GrpcTransport
from dledger.rpc.client_link import ClientLinkServer, server_tls_context
from dledger.rpc.peer_link import PeerLinkServer, server_context
from dledger.rpc.service import DLedgerServicer, add_dledger_service
from dledger.rpc.stream_server import OpenStreams
from dledger.server import DLedgerServer
from rpcgen import dledger_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc as messaging_grpc
from rpcgen.pydledger.relay.v1 import relay_pb2_grpc as relay_grpc
from store.config import MessageStoreConfig
from store.message_store import MessageStore
from dledger.errors import CorruptLogError
from store.errors import StoreError, StoreStartError
from store.socket_address import SocketAddress
from cluster.security.client_link_guard import credential_check
from cluster.security.peer_guard import PeerOnlyGuard
from broker.auth.guard import AccessGuard, AuthSettings
from broker.auth.interceptor import AuthInterceptor
from broker.auth.service import add_auth_service
from broker.namespaces import NamespaceInterceptor
from dledger.rpc.credentials import ClientSecurity, read_secret

log = logging.getLogger("dledger.node")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DLedgerService"].full_name  # dledger.v1.DLedgerService
HEALTH_SERVICES = ("", SERVICE_NAME)
# Large enough for a client batch append (many entries up to max_entry_size).
MAX_MESSAGE_BYTES = 256 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # gRPC sets SO_REUSEPORT by default: a second node started on the same
    # port would then share it silently instead of failing to start.
    ("grpc.so_reuseport", 0),
]
# Calls in flight (appends waiting for a quorum) get this long to finish.
SHUTDOWN_GRACE_S = 2.0
# After a fatal error (a failed fdatasync): calls in flight end almost at
# once, so that the node stops leading (and clients retry elsewhere) within
# a moment rather than after two graces (about 4 s of answering every call
# with the disk's error, seen in a 10-minute broker chaos run).
FATAL_GRACE_S = 0.2


class NodeStartError(RuntimeError):
    """The node could not start (port in use, unreadable log, ...)."""


def configure_logging(node_id: str, level: str = "INFO") -> None:
    """One line per event on stderr, the node id in every line, so that the
    interleaved output of a local cluster stays readable."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)s [{node_id}] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# The youngest generation is collected after this many net allocations of
# tracked objects (Python's default: 700). Most of what a node allocates dies
# by reference counting within a request, so a young collection walks about
# the objects of the requests in flight however often it runs: running it 14
# times less often does 14 times less of that walking, and the older
# generations, whose collections follow from the young ones', run as much
# less often. Measured on a leader (a sitecustomize probe timing each
# collection through gc.callbacks; send 16 x 64, two pairs alternated): the
# collector 8.3-9.6 us of CPU per message sent with 700, 1.0-1.5 us with
# 10,000, the leader 128-144 against 121-128 us per message, and full
# collections (18 ms each on that machine, the event loop stopped) 5 against
# none in the runs. What it costs is up to that many more objects of cyclic
# garbage waiting for their collection.
GC_YOUNG_THRESHOLD = 10_000


def tune_collector() -> bool:
    """Collect the youngest generation every GC_YOUNG_THRESHOLD allocations;
    PYDLEDGER_GC_TUNING=0 keeps Python's thresholds. Whether it was set."""
    if os.environ.get("PYDLEDGER_GC_TUNING", "1") == "0":
        return False
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return True


def freeze_start_up_objects() -> None:
    """What the start-up made (modules, classes, functions, servers, the
    state loaded from files) lives as long as the process: moved out of the
    collector's generations (after a collection, so that no garbage is kept),
    a full collection walks only what came later. Full collections run on
    the event loop: with 45,000 start-up objects each took 30-60 ms of a busy
    machine's CPU, several hundred ms of wall time while the process waited
    for a core, and a leader's heartbeats waited as long."""
    gc.collect()
    gc.freeze()


class Node:
    """One node's server and endpoints; `start` then `stop`, once each."""

    def __init__(self, config: DLedgerConfig, grace_s: float = SHUTDOWN_GRACE_S,
                 broker_settings: dict[str, Any] | None = None) -> None:
        self.config = config
        self.grace_s = grace_s
        self.broker_settings = broker_settings or {}
        self.server: DLedgerServer | None = None
        self.transport: GrpcTransport | None = None
        self.grpc_server: grpc.aio.Server | None = None
        # With mutual TLS: the members-only port (the peer address).
        self.peer_server: grpc.aio.Server | None = None
        # Leaders' pushes on a TCP link of their own (dledger/rpc/peer_link.py).
        self.peer_links: PeerLinkServer | None = None
        # Log clients' appends on a TCP link of their own (dledger/rpc/client_link.py).
        self.client_links: ClientLinkServer | None = None
        # With front ends (BrokerConfig.front_ends): this node's, open while it does not lead.
        self.front_end: FrontEnd | None = None
        self.tls = tls.PLAINTEXT
        self._auth_interceptor: _LateAuthInterceptor | None = None
        self.guard: AccessGuard | None = None
        self.health = health.aio.HealthServicer()
        self.metrics = NodeMetrics(config.group, config.self_id)
        self.store: MessageStore | None = None
        self.broker: Broker | None = None
        self._stopped = False
        self.streams = OpenStreams()

    async def start(self) -> None:
        config = self.config
        try:
            self.tls = tls.load_material(config.tls_cert_file, config.tls_key_file, config.peer_tls_ca_file)
        except tls.TlsConfigError as error:
            raise NodeStartError(str(error)) from None
        auth = self._auth_settings()
        signing = (auth.super_user, auth.super_secret) if auth.enabled else None
        self.transport = GrpcTransport(config, self.tls, signing)
        self.metrics.bind_peer_transport(self.transport)
        self.server = DLedgerServer(config, self.transport, observer=self.metrics.observer)
        servicer = DLedgerServicer(self.server, os.getpid(), config.metrics_address, self.streams)
        self._build_servers(servicer, auth)
        await self._start_peer_links(auth)
        await self._start_client_links(auth)
        try:
            await self.server.start()
        except CorruptLogError as error:
            raise NodeStartError(
                f"the log in {config.data_dir} cannot be opened: {error.message}. To rebuild this node from "
                f"its peers, move {config.data_dir} aside and start it again: it rejoins as a non-voter and "
                f"catches up") from None
        self.metrics.bind(self.server.status, asyncio.get_running_loop())
        broker_settings = broker_config(config, self.broker_settings)
        self.store = MessageStore(MessageStoreConfig(store_dir=os.path.join(config.data_dir, "store"),
                                                     legacy_untagged_entries=broker_settings.legacy_untagged_entries,
                                                     hot_message_bytes=broker_settings.hot_message_bytes),
                                  self.server, store_host(config))
        # The broker registers its state machines with the store before the
        # store replays the log into them.
        self.broker = Broker(broker_settings, self.store, self.server, tls=self.tls,
                             registration_observer=self.metrics.on_registration, signing=signing)
        self.streams.on_close(self.broker.clients.close_all)
        self.metrics.bind_forwarding(self.broker.forwarder.counts)
        self.metrics.bind_hot_messages(self.store.commit_log.hot)
        guard = self.guard = AccessGuard(auth, self.broker.auth_metadata)
        guard.on_denied = self.metrics.on_auth_denied
        if self._auth_interceptor is not None:
            self._auth_interceptor.interceptor = AuthInterceptor(guard)
        try:
            await self.store.start()
        except StoreStartError as error:
            raise NodeStartError(str(error)) from None
        await self.broker.start()
        # The peer port serves the messaging and admin services too: a
        # follower forwards client calls to the leader's peer address.
        messaging = MessagingServicer(self.broker)
        for server in self._servers:
            messaging_grpc.add_MessagingServiceServicer_to_server(messaging, server)
            add_admin_service(self.broker, server)
            add_auth_service(guard, self.store, self.broker.forwarder, server)
        self._add_relay(messaging)
        self._add_messaging_links(messaging)
        for server in self._servers:
            await server.start()
        await self._start_front_end(broker_settings)
        if config.metrics_address:
            self._serve_metrics(config.metrics_address)
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("node started: group=%s address=%s listen=%s peers=%s metrics=%s data_dir=%s flush=%s tls=%s "
                 "loop=%s peer_link=%s client_link=%s pid=%d", config.group, config.self_peer.address, config.bind_address,
                 ",".join(f"{p.id}={p.address}" for p in config.peers),
                 config.metrics_address or "-", config.data_dir, config.flush_mode.value,
                 ("mutual, clients on " + config.client_bind_address) if config.mutual_tls
                 else "on" if self.tls.enabled else "off", loop_name(),
                 self.server.peer_link_port if self.peer_links is not None else "off",
                 self.server.client_link_port if self.client_links is not None else "off", os.getpid())
        freeze_start_up_objects()
        tune_collector()

    def _add_relay(self, messaging: MessagingServicer) -> None:
        """The relay of forwarded calls (broker/relay.py) on the port that
        followers forward to, its calls behind that port's own checks: the
        members' port has none (with mutual TLS), the shared port namespaces
        and, with auth on, authentication and ACLs (instances of its own)."""
        def register(server: Any) -> None:
            messaging_grpc.add_MessagingServiceServicer_to_server(messaging, server)

        def checks() -> list[grpc.aio.ServerInterceptor]:
            return [] if self.peer_server is not None else self._client_checks()

        server = self.peer_server if self.peer_server is not None else self.grpc_server
        assert server is not None
        relay_grpc.add_RelayServiceServicer_to_server(
            RelayServicer(RelayedHandlers([register], checks), self.streams), server)

    def _add_messaging_links(self, messaging: MessagingServicer) -> None:
        """Our broker client's messaging calls on the client link port
        (broker/messaging_link.py), behind the client port's own checks."""
        if self.client_links is None:
            return

        def register(server: Any) -> None:
            messaging_grpc.add_MessagingServiceServicer_to_server(messaging, server)

        links = MessagingLinks(RelayedHandlers([register], self._client_checks))
        self.client_links.services[MESSAGING_LINK] = links
        self.metrics.bind_messaging_links(links)

    def _client_checks(self) -> list[grpc.aio.ServerInterceptor]:
        """New instances of the client port's interceptors (namespaces, then
        auth when it is on) for a server of its own: they cache each
        method's wrapped handler, which names one server's servicer."""
        checks: list[grpc.aio.ServerInterceptor] = [NamespaceInterceptor()]
        if self.guard is not None and self.guard.settings.enabled:
            checks.append(AuthInterceptor(self.guard))
        return checks

    def _build_servers(self, servicer: DLedgerServicer, auth: AuthSettings) -> None:
        """The client port (and, with mutual TLS, the members' port), bound
        before the log is opened: a second node started on this port (or
        with this id) fails here, before it has touched anything."""
        config = self.config
        client_interceptors: list[grpc.aio.ServerInterceptor] = []
        if config.mutual_tls:
            # Clients may not speak the peer protocol on their port.
            client_interceptors.append(PeerOnlyGuard())
            self.peer_server = grpc.aio.server(options=GRPC_OPTIONS)
        # Namespaces first: the ACL check then sees the names as stored.
        client_interceptors.append(NamespaceInterceptor())
        # The guard needs the broker's users, made later; the interceptor
        # defers to it and no call is served before the server starts.
        self._auth_interceptor = _LateAuthInterceptor() if auth.enabled else None
        if self._auth_interceptor is not None:
            client_interceptors.append(self._auth_interceptor)
        self.grpc_server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=client_interceptors)
        for server in self._servers:
            add_dledger_service(servicer, server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if self.peer_server is not None:
            self._bind(self.peer_server, config.bind_address, peer_port=True)
            self._bind(self.grpc_server, config.client_bind_address)
        else:
            self._bind(self.grpc_server, config.bind_address)

    async def _start_peer_links(self, auth: AuthSettings) -> None:
        """The peer link's port, on the host the gRPC port binds (before the
        log opens, as the gRPC ports are: a clash fails the start early)."""
        config = self.config
        if not config.peer_link_enabled:
            return
        assert self.server is not None
        context = (server_context(config.tls_cert_file, config.tls_key_file, config.peer_tls_ca_file)
                   if config.mutual_tls else None)
        self.peer_links = PeerLinkServer(self.server, (auth.super_user, auth.super_secret) if auth.enabled else None,
                                         context)
        host = config.bind_address.rpartition(":")[0].strip("[]")
        try:
            self.server.peer_link_port = await self.peer_links.start(host, config.peer_link_port)
        except OSError as error:
            raise NodeStartError(f"cannot listen for peer links on {host}:{config.peer_link_port}: "
                                 f"{error.strerror}") from None

    async def _start_client_links(self, auth: AuthSettings) -> None:
        """The client link's port, on the host the client gRPC port binds;
        TLS as that port's, the same credentials and ACL as its AppendStream."""
        config = self.config
        if not config.client_link_enabled:
            return
        assert self.server is not None
        context = server_tls_context(config.tls_cert_file, config.tls_key_file) if self.tls.enabled else None
        check = credential_check(lambda: self.guard) if auth.enabled else None
        self.client_links = ClientLinkServer(self.server, check, context)
        # Where the client gRPC port binds: its own address with mutual TLS,
        # else the one port everything shares.
        bind = config.client_bind_address if config.mutual_tls else config.bind_address
        host = bind.rpartition(":")[0].strip("[]")
        try:
            self.server.client_link_port = await self.client_links.start(host, config.client_link_port)
        except OSError as error:
            raise NodeStartError(f"cannot listen for client links on {host}:{config.client_link_port}: "
                                 f"{error.strerror}") from None
        self.metrics.bind_client_links(self.client_links)

    async def _start_front_end(self, settings: BrokerConfig) -> None:
        address = settings.front_end_of(self.config.self_id)
        if not address:
            if settings.front_ends:
                raise NodeStartError(f"--front-ends names no front end for {self.config.self_id}: give every "
                                     "node's (clients are routed to all of them)")
            return
        bind = settings.front_end_listen_address or address
        broker = self.broker
        assert broker is not None and self.server is not None

        def build(draining: Callable[[], bool]) -> grpc.aio.Server:
            # Interceptors of its own (shared with the client port, that port
            # would serve this front end's servicer).
            server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=self._client_checks())
            messaging_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(broker, draining), server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            self._bind(server, bind)
            return server

        self.front_end = FrontEnd(address, self.server, build, settings.front_end_drain_s,
                                  broker.consumer.polling.wake_all)
        await self.front_end.start()

    def _auth_settings(self) -> AuthSettings:
        config = self.config
        if not config.auth_enabled:
            return AuthSettings()
        try:
            secret = read_secret(config.auth_super_secret_file)
        except ValueError as error:
            raise NodeStartError(f"auth_super_secret_file: {error}") from None
        return AuthSettings(True, config.auth_super_user, secret, config.auth_max_skew_s)

    @property
    def _servers(self) -> list[grpc.aio.Server]:
        return [s for s in (self.grpc_server, self.peer_server) if s is not None]

    def _bind(self, server: grpc.aio.Server, address: str, peer_port: bool = False) -> None:
        try:
            port = tls.add_port(server, address, self.tls, peer_port=peer_port)
        except RuntimeError as error:
            raise NodeStartError(f"cannot listen on {address}: {error}") from None
        if port == 0:
            raise NodeStartError(f"cannot listen on {address} (port in use?)")

    def _serve_metrics(self, address: str) -> None:
        try:
            config = self.config
            # The web console shares the port; it reads the cluster through
            # this node's gRPC APIs, on its client port (TLS trusting the
            # cluster CA). With auth on it holds no credentials: the page asks
            # the user to sign in and signs its requests (cluster/console/).
            # Raw reads send log bytes in clear and unsigned: only where
            # the node's own APIs need neither TLS nor credentials.
            raw_reads = RawReadEndpoint(self.server, asyncio.get_running_loop(),
                                        enabled=not self.tls.enabled and not config.auth_enabled,
                                        on_run_sent=self.metrics.on_raw_run_sent)
            self.metrics.serve_with_console(address, Target((self_client_address(config),), config.group),
                                            ClientSecurity(ca=self.tls.ca), sign_in=config.auth_enabled,
                                            raw_reads=raw_reads)
        except OSError as error:
            raise NodeStartError(f"cannot serve metrics on {address}: {error.strerror}") from None

    async def stop(self) -> None:
        """Idempotent; stops whatever start() got to."""
        if self._stopped:
            return
        self._stopped = True
        log.info("node stopping")
        await self.health.enter_graceful_shutdown()
        # Every port stops taking calls first (the front end and the servers
        # stop together); then the streams held open by peers and clients end,
        # once what they carry is answered; the grace is for calls in flight.
        stops = [asyncio.ensure_future(server.stop(self.grace_s)) for server in self._servers]
        if self.front_end is not None:
            stops.append(asyncio.ensure_future(self.front_end.stop(self.grace_s)))
        await asyncio.sleep(0)   # the stops begin: no port takes a new call from here on
        self.streams.close()
        await asyncio.gather(*stops)
        if self.peer_links is not None:
            await self.peer_links.stop()
        if self.client_links is not None:
            await self.client_links.stop()
        if self.broker is not None:
            await self.broker.stop()
        if self.store is not None:
            await self.store.shutdown()
        if self.server is not None:
            await self.server.shutdown()
        if self.transport is not None:
            await self.transport.close()
        await asyncio.to_thread(self.metrics.close)
        log.info("node stopped")


class _LateAuthInterceptor(grpc.aio.ServerInterceptor):
    """The server (and its interceptors) is made before the broker that
    holds the users; until the real interceptor is set no call is served
    (the port opens only after), so this only defers to it."""

    def __init__(self) -> None:
        self.interceptor: AuthInterceptor | None = None

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        assert self.interceptor is not None, "the auth interceptor is set before the server starts"
        return await self.interceptor.intercept_service(continuation, details)


def self_client_address(config: DLedgerConfig) -> str:
    """Where this node's own console reaches its client port: the bound
    address, loopback for a wildcard bind (node certificates always name
    127.0.0.1, so TLS verifies)."""
    address = config.client_bind_address if config.mutual_tls else config.bind_address
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "::", "[::]", "") else address


def broker_config(config: DLedgerConfig, settings: dict[str, Any] | None = None) -> BrokerConfig:
    """The broker serves the DLedger group; routes list every node's client
    address; `settings` (the TOML's [broker] table) tune the rest."""
    return BrokerConfig(broker_name=config.group,
                        endpoints=tuple(config.client_address_of(peer.id) for peer in config.peers),
                        **(settings or {}))


def store_host(config: DLedgerConfig) -> SocketAddress:
    """The STOREHOST written into messages (and the offset message id): this
    node's client address when it is an IP literal, else its resolved host."""
    host, _, port = config.client_address_of(config.self_id).rpartition(":")
    for candidate in (host, config.self_peer.host):
        try:
            return SocketAddress.parse(f"{candidate}:{port}")
        except (ValueError, StoreError):
            try:
                return SocketAddress.parse(f"{socket.gethostbyname(candidate)}:{port}")
            except (OSError, ValueError, StoreError):
                continue
    return SocketAddress("0.0.0.0", int(port))


async def run_node(config: DLedgerConfig, exit_with_parent: int | None = None,
                   broker_settings: dict[str, Any] | None = None) -> int:
    """Run until SIGTERM/SIGINT (or the parent `exit_with_parent` is gone);
    returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, signum, stop)
    node = Node(config, broker_settings=broker_settings)
    crashed: list[str] = []

    def fail_stop(what: str, error: BaseException) -> None:
        # A loop of the node died (logged with its traceback where it died),
        # or its disk failed: stop, and exit non-zero, rather than serve half
        # a node.
        crashed.append(f"{what}: {error}")
        stop.set()

    set_crash_handler(fail_stop)
    watcher = asyncio.create_task(watch_parent(exit_with_parent, stop)) if exit_with_parent else None
    try:
        await node.start()
        await stop.wait()
        if crashed:
            log.critical("stopping after a fatal error: %s", "; ".join(crashed))
            node.grace_s = FATAL_GRACE_S
            return 1
        return 0
    except NodeStartError as error:
        log.error("%s", error)
        return 1
    except Exception:  # the process is about to exit: say why, once
        log.exception("node failed")
        return 1
    finally:
        if watcher is not None:
            watcher.cancel()
        await node.stop()


def _on_signal(signum: int, stop: asyncio.Event) -> None:
    log.info("received %s", signal.Signals(signum).name)
    stop.set()


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """A node started by `dledger cluster up` must not outlive the launcher
    when the launcher itself is killed (SIGKILL gives it no chance to clean
    up): the node stops once it has been re-parented."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    log.warning("launcher (pid %d) is gone; stopping", parent_pid)
    stop.set()
