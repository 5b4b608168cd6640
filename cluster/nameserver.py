"""Run a name server (namesrv/): `dledger nameserver --listen HOST:PORT [--metrics-port P]`.

One gRPC port (the NameServer service and gRPC health), an optional metrics
port, and one task: the scanner, which drops groups not heard from for the
expiry time (RocketMQ scans every 10 s and drops after 120 s).

Secured as a node is (namesrv/access.py says who may do what): with a
certificate, its key and the cluster CA, `--listen` speaks TLS to clients
and `--peer-listen` is the members' port, which requires a certificate of
the cluster CA (registrations are served there only); with auth on, calls
on the clients' port must be signed. A half-made configuration is refused
with one line before anything starts.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.auth.guard import AuthSettings
from dledger.rpc import tls
from dledger.rpc.credentials import read_secret
from namesrv.access import NameServerAccess
from namesrv.metrics import NameServerMetrics
from namesrv.route_table import DEFAULT_EXPIRY_S, RouteTable
from namesrv.service import NameServerServicer
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

log = logging.getLogger("dledger.namesrv")

DEFAULT_SCAN_INTERVAL_S = 10.0          # RocketMQ's scanNotActiveBroker period


@dataclass(frozen=True)
class NameServerConfig:
    listen: str
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    # A group not heard from for this long is dropped from every route.
    expiry_s: float = DEFAULT_EXPIRY_S
    # How often the scanner looks for such groups (lookups also skip them).
    scan_interval_s: float = DEFAULT_SCAN_INTERVAL_S
    # Security (as a node's, cluster/config.py): the three TLS files go
    # together and need `peer_listen`, the members' mutual-TLS port.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    peer_tls_ca_file: str = ""
    peer_listen: str = ""
    auth_enabled: bool = False
    auth_super_user: str = "admin"
    auth_super_secret_file: str = ""
    auth_max_skew_s: float = 900.0


class NameServerConfigError(ValueError):
    """A configuration the name server cannot start with; one line."""


def check_config(config: NameServerConfig) -> tuple[tls.TlsMaterial, AuthSettings]:
    """The TLS material and auth settings, or NameServerConfigError."""
    try:
        material = tls.load_material(config.tls_cert_file, config.tls_key_file, config.peer_tls_ca_file)
    except tls.TlsConfigError as error:
        raise NameServerConfigError(str(error)) from None
    if material.enabled and not config.peer_listen:
        raise NameServerConfigError("TLS needs --peer-listen HOST:PORT: the members' mutual-TLS port, where "
                                    "groups register (--listen serves clients)")
    if config.peer_listen and not material.enabled:
        raise NameServerConfigError("--peer-listen is the members' mutual-TLS port: it needs --tls-cert-file, "
                                    "--tls-key-file and --peer-tls-ca-file")
    if config.peer_listen and config.peer_listen == config.listen:
        raise NameServerConfigError("--peer-listen must differ from --listen")
    if not config.auth_enabled:
        return material, AuthSettings()
    if not config.auth_super_secret_file:
        raise NameServerConfigError("--auth-enabled needs --auth-super-secret-file (the cluster's super user's "
                                    "secret, as the nodes have it)")
    try:
        secret = read_secret(config.auth_super_secret_file)
    except ValueError as error:
        raise NameServerConfigError(f"--auth-super-secret-file: {error}") from None
    return material, AuthSettings(True, config.auth_super_user, secret, config.auth_max_skew_s)


class NameServer:
    def __init__(self, config: NameServerConfig) -> None:
        self.config = config
        self.table = RouteTable(config.expiry_s)
        self.metrics = NameServerMetrics()
        self.metrics.watch_table(lambda: len(self.table.groups), lambda: self.table.expired_total)
        self.health = health.aio.HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        # With TLS: the members-only mutual-TLS port.
        self.peer_server: grpc.aio.Server | None = None
        self._scanner: asyncio.Task[None] | None = None
        self.access = NameServerAccess(AuthSettings(), tls=False)

    async def start(self) -> None:
        try:
            material, auth = check_config(self.config)
        except NameServerConfigError as error:
            raise OSError(str(error)) from None
        access = self.access = NameServerAccess(auth, tls=material.enabled)
        access.on_denied = lambda reason, rpc: self.metrics.auth_denied.labels(reason, rpc).inc()
        self.grpc_server = self._server(NameServerServicer(self.table, self.metrics, access=access),
                                        self.config.listen, material)
        if material.enabled:
            self.peer_server = self._server(NameServerServicer(self.table, self.metrics, access=access,
                                                               members_port=True),
                                            self.config.peer_listen, material, peer_port=True)
        for server in self._servers:
            await server.start()
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.metrics_host, self.config.metrics_port)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._scanner = asyncio.ensure_future(self._scan())
        security = "off" if not access.secured else ", ".join(
            part for part in (f"TLS, members on {self.config.peer_listen}" if material.enabled else "",
                              "auth" if auth.enabled else "") if part)
        log.info("name server listening on %s (metrics %s, expiry %.1f s, scan every %.1f s, security %s)",
                 self.config.listen, self.config.metrics_port or "-", self.config.expiry_s,
                 self.config.scan_interval_s, security)

    def _server(self, servicer: NameServerServicer, address: str, material: tls.TlsMaterial,
                peer_port: bool = False) -> grpc.aio.Server:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        namesrv_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            port = tls.add_port(server, address, material, peer_port=peer_port)
        except RuntimeError as error:
            raise OSError(f"cannot listen on {address}: {error}") from None
        if port == 0:
            raise OSError(f"cannot listen on {address} (port in use?)")
        return server

    @property
    def _servers(self) -> list[grpc.aio.Server]:
        return [s for s in (self.grpc_server, self.peer_server) if s is not None]

    async def _scan(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval_s)
            for name in self.table.expire(time.monotonic()):
                log.warning("group %s not heard from for %.1f s: dropped", name, self.config.expiry_s)
            self.access.forget(set(self.table.groups))

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            await asyncio.gather(self._scanner, return_exceptions=True)
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(*(server.stop(1.0) for server in self._servers))
        await asyncio.to_thread(self.metrics.close)


async def run_nameserver(config: NameServerConfig, exit_with_parent: int | None = None) -> int:
    from cluster.node import watch_parent

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = NameServer(config)
    try:
        await server.start()
    except OSError as error:
        log.error("%s", error)
        await server.stop()
        return 1
    watcher = asyncio.create_task(watch_parent(exit_with_parent, stop)) if exit_with_parent else None
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await server.stop()
    return 0
