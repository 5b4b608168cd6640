"""BaseClient: what every client does around its own calls.

start(): Telemetry settings sync (and the broker's settings back), then a
background loop that sends Heartbeat (the consumers' names their group, which
the broker creates on first sight) and checks that the leader has not moved.
close(): NotifyClientTermination, then the stream and channels. Clients are
async context managers: `async with Producer(...) as producer:`.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any, Callable, Iterable

from broker.client.config import ClientConfig
from broker.client.connection import Connection
from broker.client.connection import CLIENT_VERSION, access_point
from broker.client.errors import ClientError, PreconditionFailedError, check_status
from broker.client.message import duration
from broker.client.telemetry import CommandHandler, TelemetrySession
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

log = logging.getLogger(__name__)


class BaseClient:
    client_type: pb.ClientType = pb.CLIENT_TYPE_UNSPECIFIED

    def __init__(self, servers: str | Iterable[str] | ClientConfig, **config: Any) -> None:
        self.config = ClientConfig.of(servers, **config)
        self.connection = Connection(self.config)
        self.telemetry = TelemetrySession(self.connection, self.settings, self.command_handler())
        self._heartbeat: asyncio.Task[None] | None = None
        self.started = False
        self._closed = False

    @property
    def client_id(self) -> str:
        return self.connection.client_id

    # -------------------------------------------------- what subclasses say
    def settings(self) -> pb.Settings:
        """The settings this client announces over Telemetry."""
        return pb.Settings(client_type=self.client_type, request_timeout=duration(self.config.request_timeout_s),
                           access_point=access_point(self.config.servers),
                           user_agent=pb.UA(language=pb.PYTHON, version=CLIENT_VERSION,
                                            platform=sys.platform, hostname=socket.gethostname()))

    def group(self) -> str | None:
        return None

    def command_handler(self) -> CommandHandler | None:
        return None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> "BaseClient":
        if self._closed:
            raise PreconditionFailedError(pb.PRECONDITION_FAILED, "the client is closed")
        if self.started:
            return self
        try:
            await self.telemetry.start(self.config.deadline_s)
            await self.heartbeat()
        except BaseException:
            await self.close()  # `async with` does not call __aexit__ when __aenter__ fails
            raise
        self._heartbeat = asyncio.ensure_future(self._keep_alive())
        self.started = True
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self.started:
            await self._notify_termination()
        await self.telemetry.close()
        await self.connection.close()

    async def __aenter__(self) -> Any:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def require_started(self) -> None:
        if self._closed:
            raise PreconditionFailedError(pb.PRECONDITION_FAILED, "the client is closed")
        if not self.started:
            raise PreconditionFailedError(pb.PRECONDITION_FAILED, "the client is not started: await start() "
                                                                  "or use it with `async with`")

    # ------------------------------------------------------------ keep-alive
    async def heartbeat(self) -> None:
        await self.heartbeat_on(self.connection)

    async def heartbeat_on(self, connection: Connection, retry: Callable[[ClientError], bool] | None = None) -> None:
        """A Heartbeat through `connection` (the configured servers, or one
        broker group's connection when there are several); `retry` as in
        Connection.call."""
        group = self.group()
        request = spb.HeartbeatRequest(client_type=self.client_type)
        if group is not None:
            request.group.CopyFrom(connection.resource(group))

        async def attempt(address: str) -> None:
            answer = await connection.messaging(address).Heartbeat(
                request, metadata=connection.headers(), timeout=self.config.request_timeout_s)
            check_status(answer.status, "heartbeat")

        await connection.call("heartbeat", attempt, retry)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            try:
                leader = await self.connection.refresh_leader()
                self.telemetry.follow_leader(leader)
                await self.heartbeat()
            except ClientError as error:
                log.warning("heartbeat failed: %s", error)

    async def _notify_termination(self) -> None:
        request = spb.NotifyClientTerminationRequest()
        group = self.group()
        if group is not None:
            request.group.CopyFrom(self.connection.resource(group))
        address = self.connection.known_leader
        if address is None:
            return  # nobody to tell: the broker drops the session when the stream ends
        try:
            await self.connection.messaging(address).NotifyClientTermination(
                request, metadata=self.connection.headers(), timeout=1.0)
        except Exception as error:  # noqa: BLE001 - best effort on the way out
            log.debug("NotifyClientTermination failed: %s", error)
