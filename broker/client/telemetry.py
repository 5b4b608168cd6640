"""TelemetrySession: the client's long-lived Telemetry stream to the leader.

RocketMQ 5 clients open one bidirectional Telemetry stream, send their
settings first and wait for the broker's answer (the authoritative settings:
body limit, retry policy). The stream then stays open for commands the broker
starts: a transaction check-back (RecoverOrphanedTransactionCommand), a thread
dump request. The broker keeps the session where the stream ends, so the
stream must end at the leader: when it breaks, or the leader moves, the
session reconnects to the leader of the moment and sends its settings again.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import traceback
from typing import Awaitable, Callable

import grpc

from broker.client.connection import Connection
from broker.client.errors import UnavailableError, check_status
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

log = logging.getLogger(__name__)

CommandHandler = Callable[[spb.TelemetryCommand], Awaitable[spb.TelemetryCommand | None]]
# Reconnect backoff after the stream breaks.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0


class TelemetrySession:
    def __init__(self, connection: Connection, settings: Callable[[], pb.Settings],
                 on_command: CommandHandler | None = None) -> None:
        self.connection = connection
        self._settings = settings
        self._on_command = on_command
        self.server_settings: pb.Settings | None = None
        self.address: str | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._closed = False
        # An UNAUTHORIZED or FORBIDDEN answer: retrying cannot help.
        self._refusal: Exception | None = None

    async def start(self, timeout: float) -> pb.Settings:
        """Open the stream; returns the broker's settings once it answered."""
        self._task = asyncio.ensure_future(self._run())
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise UnavailableError(pb.HA_NOT_AVAILABLE,
                                   f"the broker did not answer the client's settings within {timeout:.0f} s") from None
        if self._refusal is not None:
            await self.close()
            raise self._refusal
        assert self.server_settings is not None
        return self.server_settings

    async def resync(self) -> None:
        """Send the settings again (e.g. the producer has a new topic)."""
        call = self._call
        if call is not None:
            try:
                await call.write(spb.TelemetryCommand(settings=self._settings()))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
                log.debug("telemetry settings resync failed: %s", error)

    def follow_leader(self, leader: str) -> None:
        """Reconnect if the stream does not end at `leader` (it moved)."""
        if self._call is not None and self.address not in (None, leader):
            log.info("telemetry: leader moved from %s to %s; reconnecting", self.address, leader)
            self._call.cancel()

    async def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        tasks = [t for t in [self._task, *self._handlers] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ the stream
    async def _run(self) -> None:
        backoff = RECONNECT_MIN_S
        while not self._closed:
            try:
                await self._serve_once()
                backoff = RECONNECT_MIN_S
            except asyncio.CancelledError:
                if self._closed:
                    raise
            except Exception as error:  # noqa: BLE001 - any break of the stream: reconnect
                if getattr(error, "code", None) in (pb.UNAUTHORIZED, pb.FORBIDDEN):
                    self._refusal = error
                    self._synced.set()
                    return
                log.debug("telemetry stream to %s ended: %s", self.address, error)
                if self.address is not None:
                    self.connection.forget(self.address)
            if self._closed:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    async def _serve_once(self) -> None:
        connection = self.connection
        self.address = await connection.leader()
        call = connection.messaging(self.address).Telemetry(metadata=connection.headers())
        self._call = call
        try:
            await call.write(spb.TelemetryCommand(settings=self._settings()))
            while True:
                command = await call.read()
                if command is grpc.aio.EOF:
                    return
                await self._dispatch(call, command)
        except asyncio.CancelledError:
            if self._closed:
                raise
        finally:
            self._call = None
            call.cancel()

    async def _dispatch(self, call: grpc.aio.StreamStreamCall, command: spb.TelemetryCommand) -> None:
        if command.HasField("settings"):
            if command.HasField("status"):
                check_status(command.status, "telemetry settings")
            self.server_settings = command.settings
            self._synced.set()
        elif command.HasField("print_thread_stack_trace_command"):
            nonce = command.print_thread_stack_trace_command.nonce
            await call.write(spb.TelemetryCommand(
                status=pb.Status(code=pb.OK, message="OK"),
                thread_stack_trace=spb.ThreadStackTrace(nonce=nonce, thread_stack_trace=_stacks())))
        elif command.HasField("command") and self._on_command is not None:
            # Answered in its own task: the application's checker may be slow,
            # and the stream must keep reading meanwhile.
            task = asyncio.ensure_future(self._answer(call, command))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        elif command.HasField("status") and command.status.code != pb.OK:
            check_status(command.status, "telemetry")

    async def _answer(self, call: grpc.aio.StreamStreamCall, command: spb.TelemetryCommand) -> None:
        assert self._on_command is not None
        try:
            reply = await self._on_command(command)
            if reply is not None:
                await call.write(reply)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one bad command must not end the session
            log.exception("telemetry command %s failed", command.WhichOneof("command"))


def _stacks() -> str:
    frames = sys._current_frames()
    return "\n".join(f"thread {ident}:\n{''.join(traceback.format_stack(frame))}" for ident, frame in frames.items())
