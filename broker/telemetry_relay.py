"""A client's Telemetry stream, kept attached to whichever node leads.

Client sessions live on the leader (it sends transaction check-backs through
them). A client's stream may arrive at any node; a follower relays it to the
leader. When the leader changes, the official client neither notices (its
stream to this node is still open) nor re-sends its settings for up to 300 s,
so the new leader would not know it. The relay therefore keeps the client's
stream open across leader changes: it moves the session to the new leader (or
serves it here, if this node now leads) and re-sends the client's last
settings, so the new leader knows the session at once.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc

from broker.clients import ClientRegistry
from broker.errors import BrokerError
from broker.forwarding import LeaderForwarder
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

log = logging.getLogger(__name__)

# While serving the session here, check this often whether this node still leads.
LEADERSHIP_POLL_S = 0.2
# Between two failed attachments (the leader is gone and none is known yet,
# or it cannot be reached): without a pause the relay spun, hundreds of tries
# per client and second, on the followers' CPU while they elect.
REATTACH_PAUSE_S = 0.05
_END = object()


class TelemetryRelay:
    def __init__(self, client_id: str, commands: AsyncIterator[spb.TelemetryCommand],
                 context: grpc.aio.ServicerContext, registry: ClientRegistry, forwarder: LeaderForwarder) -> None:
        self.client_id = client_id
        self.context = context
        self.registry = registry
        self.forwarder = forwarder
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._settings: spb.TelemetryCommand | None = None
        self._client_done = False
        self._reader = asyncio.ensure_future(self._read(commands))

    async def _read(self, commands: AsyncIterator[spb.TelemetryCommand]) -> None:
        try:
            async for command in commands:
                if command.HasField("settings"):
                    self._settings = command
                self._inbox.put_nowait(command)
        finally:
            self.end()

    def end(self) -> None:
        """Ends the relay as the client's closing its stream does (also when this node stops)."""
        self._client_done = True
        self._inbox.put_nowait(_END)

    async def run(self) -> AsyncIterator[spb.TelemetryCommand]:
        resumed = False
        if self.registry.closed:
            self._reader.cancel()
            return
        self.registry.relays.add(self.end)
        try:
            while not self._client_done:
                local = self.forwarder.is_leader()
                if local:
                    stream = self.registry.telemetry(self.client_id, self._commands(resumed), self._lost_leadership)
                else:
                    stream = self.forwarder.bidi_stream("Telemetry", self._commands(resumed), self.context)
                try:
                    async for response in stream:
                        yield response
                except BrokerError as error:
                    # The leader went away (or none is elected yet): attach anew.
                    log.debug("telemetry of %s moves on: %s", self.client_id, error.message)
                    resumed = True
                    await asyncio.sleep(REATTACH_PAUSE_S)
                    continue
                if local and not self.forwarder.is_leader():
                    resumed = True      # this node stopped leading: move the session
                    continue
                return  # closed on purpose (terminated, or replaced by the client's newer stream)
        finally:
            self.registry.relays.discard(self.end)
            self._reader.cancel()

    async def _commands(self, resumed: bool) -> AsyncIterator[spb.TelemetryCommand]:
        """The client's commands for one attachment; on a new one, its last
        settings first, so the session is known where it is now."""
        if resumed and self._settings is not None:
            yield self._settings
        while True:
            command = await self._inbox.get()
            if command is _END:
                self._inbox.put_nowait(_END)  # the next attachment, if any, ends too
                return
            yield command  # type: ignore[misc]

    async def _lost_leadership(self) -> None:
        """Resolves when this node no longer leads (the local session then ends
        and the relay moves it to the new leader)."""
        while self.forwarder.is_leader() and not self._client_done:
            await asyncio.sleep(LEADERSHIP_POLL_S)
