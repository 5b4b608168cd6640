"""Run a name server (namesrv/): `dledger nameserver --listen HOST:PORT [--metrics-port P]`.

One gRPC port (the NameServer service and gRPC health), an optional metrics
port, and one task: the scanner, which drops groups not heard from for the
expiry time (RocketMQ scans every 10 s and drops after 120 s).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

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


class NameServer:
    def __init__(self, config: NameServerConfig) -> None:
        self.config = config
        self.table = RouteTable(config.expiry_s)
        self.metrics = NameServerMetrics()
        self.metrics.watch_table(lambda: len(self.table.groups), lambda: self.table.expired_total)
        self.health = health.aio.HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self._scanner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        server = self.grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        namesrv_pb2_grpc.add_NameServerServicer_to_server(NameServerServicer(self.table, self.metrics), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            port = server.add_insecure_port(self.config.listen)
        except RuntimeError as error:
            raise OSError(f"cannot listen on {self.config.listen}: {error}") from None
        if port == 0:
            raise OSError(f"cannot listen on {self.config.listen} (port in use?)")
        await server.start()
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.metrics_host, self.config.metrics_port)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._scanner = asyncio.ensure_future(self._scan())
        log.info("name server listening on %s (metrics %s, expiry %.1f s, scan every %.1f s)", self.config.listen,
                 self.config.metrics_port or "-", self.config.expiry_s, self.config.scan_interval_s)

    async def _scan(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval_s)
            for name in self.table.expire(time.monotonic()):
                log.warning("group %s not heard from for %.1f s: dropped", name, self.config.expiry_s)

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            await asyncio.gather(self._scanner, return_exceptions=True)
        await self.health.enter_graceful_shutdown()
        if self.grpc_server is not None:
            await self.grpc_server.stop(1.0)
        await asyncio.to_thread(self.metrics.close)


async def run_nameserver(config: NameServerConfig) -> int:
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
    try:
        await stop.wait()
    finally:
        await server.stop()
    return 0
