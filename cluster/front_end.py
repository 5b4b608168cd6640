"""FrontEnd: a node's second client port, RocketMQ 5's proxy inside the node.

A client connection to the leader is cut when the leader dies, and the
official clients (which we cannot change) answer a call in flight on it
with an error: a send they retry, a receive they do not. So with front ends
(`BrokerConfig.front_ends`) the routes point clients at ports that never
belong to the leader: each node serves the messaging protocol on its front
end while it does not lead, forwarding what needs the leader and holding
calls through leader changes (broker/service.py, broker/forwarding.py), and
closes it while it leads. Killing or pausing the leader then cuts no client
connection: clients sit on followers, whose calls wait for the next leader.

Closing is graceful: the server stops listening and sends GOAWAY on its
connections, so a client's next call opens a connection to the next address
of its endpoint list (the official clients' gRPC channel picks the first
address that accepts); calls already running finish (a long poll is
answered at once, empty), and whatever is still open after
`front_end_drain_s` (Telemetry streams) is cut. The close starts the moment
the node becomes leader, before it serves the calls it held through the
election, so a client that waits for each answer (the official clients'
`send`, `receive`) sees the GOAWAY before it can send another call to this
port. A group with a single voter keeps its front end open (nobody else
could serve it).

`serves_clients` is the rule; the task only waits for role changes and
opens or closes the port.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import grpc

from dledger.server import DLedgerServer

log = logging.getLogger(__name__)

# A port that could not be bound (still held by an old server's socket, say)
# is tried again this often.
REBIND_INTERVAL_S = 1.0
# After the GOAWAY went out, the port's long polls are answered (empty) this
# much later: by then their clients know to send the next call elsewhere.
GOAWAY_NOTICE_S = 0.05
# Builds a bound, not yet started, server for the front end; its argument
# tells the servicer whether this generation of the port is draining.
ServerFactory = Callable[[Callable[[], bool]], grpc.aio.Server]


def serves_clients(is_leader: bool, voters: int) -> bool:
    """Whether a node's front end is open: not while it leads, unless no
    other voter could lead (a group of one)."""
    return not is_leader or voters <= 1


class _Generation:
    """One opening of the port: its server and whether it is draining."""

    def __init__(self) -> None:
        self.server: grpc.aio.Server | None = None
        self.draining = False


class FrontEnd:
    def __init__(self, address: str, server: DLedgerServer, build: ServerFactory, drain_s: float,
                 on_drain: Callable[[], None]) -> None:
        self.address = address
        self.server = server
        self.build = build
        self.drain_s = drain_s
        # Wakes the long polls of a draining port (they then answer empty).
        self.on_drain = on_drain
        self._current: _Generation | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._draining: set[_Generation] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.opened = 0
        self.closed = 0

    @property
    def open(self) -> bool:
        return self._current is not None

    def wanted(self) -> bool:
        return serves_clients(self.server.member_state.is_leader, len(self.server.membership.current.voters))

    async def start(self) -> None:
        """Open the port if the node does not lead (a port that cannot be
        bound now is an error the caller reports), then follow its role."""
        self.server.member_state.add_listener(self._on_role_change)
        if self.wanted():
            await self._open(raise_errors=True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="FrontEnd")

    async def stop(self, grace_s: float) -> None:
        """Close the port; calls still running on it, or on a generation still
        draining, get `grace_s` (the node's shutdown grace, not the drain's)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # Generations closed earlier are stopped again with the shorter grace
        # (gRPC keeps the shorter); the current one is stopped once, with it.
        earlier = [g for g in self._draining if g.server is not None]
        if self._current is not None:
            self._close(grace_s)
        await asyncio.gather(*(g.server.stop(grace_s) for g in earlier), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _on_role_change(self, *_: object) -> None:
        # Closing starts here, within the role change, so that the GOAWAY
        # goes out before the calls held through the election are answered.
        if self._current is not None and not self.wanted():
            self._close(self.drain_s)
        self._changed.set()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._changed.wait(), REBIND_INTERVAL_S if self._needs_open() else None)
            except asyncio.TimeoutError:
                pass
            self._changed.clear()
            await self._reconcile()

    def _needs_open(self) -> bool:
        return self._current is None and self.wanted()

    async def _reconcile(self) -> None:
        if self._current is not None and not self.wanted():
            self._close(self.drain_s)
        elif self._needs_open():
            await self._open()

    async def _open(self, raise_errors: bool = False) -> None:
        generation = _Generation()
        try:
            server = self.build(lambda: generation.draining)
        except Exception as error:  # noqa: BLE001 - a busy port is tried again, the node keeps serving
            if raise_errors:
                raise
            log.warning("front end %s cannot open yet: %s; trying again in %.0f s", self.address, error,
                        REBIND_INTERVAL_S)
            return
        generation.server = server
        await server.start()
        self._current = generation
        self.opened += 1
        log.info("front end %s open (this node does not lead)", self.address)

    def _close(self, grace_s: float) -> None:
        generation, self._current = self._current, None
        if generation is None or generation.server is None:
            return
        self.closed += 1
        log.info("front end %s closing (this node leads); calls in flight get %.0f s", self.address, grace_s)
        # The stop's first step (stop listening, GOAWAY) runs on the loop's
        # next turn, before the held calls' polls come round.
        stopping = asyncio.ensure_future(generation.server.stop(grace_s))
        self._draining.add(generation)
        task = asyncio.ensure_future(self._drain(generation, stopping))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _drain(self, generation: _Generation, stopping: asyncio.Future[None]) -> None:
        try:
            await asyncio.sleep(GOAWAY_NOTICE_S)
            generation.draining = True
            self.on_drain()
            await stopping
        finally:
            self._draining.discard(generation)
