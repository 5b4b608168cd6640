"""LinkProxy: one directed peer link (source -> destination) as an asyncio TCP
proxy on loopback that the harness can cut, cut in one direction, delay and heal.

The source node's `--peers` names this proxy as the destination's address, so
every connection the source opens to the destination runs through it. On such
a connection bytes flow *forward* (source -> destination: the source's
requests) and *backward* (destination -> source: the destination's replies).
Each direction can be dropped or delayed on its own, and the state is looked
at for every chunk as it is due to leave the proxy, so a fault hits the
connections that are open already, not only new ones.

The fault model, chosen to behave like packets dropped by a firewall rather
than like a refused connection:

- *Dropping* a direction discards its bytes while both TCP connections stay
  open, so the sender sees no error, only silence (and its RPC deadlines
  expire), as with a real partition. A new connection during a drop is
  accepted, but nothing is forwarded in the dropped direction; the proxy only
  connects to the destination once it has forward bytes to deliver, so
  with the forward direction dropped the destination never sees the
  connection at all.
- Dropped bytes leave a hole in the middle of an HTTP/2 stream that no TCP
  retransmission will fill. So when a dropped direction heals, every
  connection that lost bytes is closed (as TCP would after its retransmission
  timeout) and gRPC reconnects; connections that lost nothing go on.
- An end of stream (a node's socket closing) is subject to the drop like any
  byte: a node killed behind a cut is not seen to close.
- *Delay* holds each chunk for the given time, keeping order, in both the
  open connections and new ones.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 10
# Chunks held per direction of a connection before the proxy stops reading
# (so a paused or slow peer pushes back through TCP instead of into memory).
QUEUE_CHUNKS = 256
_EOF = b""


@dataclass(frozen=True)
class LinkState:
    """What happens to each direction of a link's traffic."""
    drop_forward: bool = False
    drop_backward: bool = False
    delay_forward_s: float = 0.0
    delay_backward_s: float = 0.0


HEALTHY = LinkState()


@dataclass(eq=False)  # identity: connections live in a set
class _Connection:
    """One accepted connection and, once needed, its upstream connection."""
    client_reader: asyncio.StreamReader
    client_writer: asyncio.StreamWriter
    upstream_reader: asyncio.StreamReader | None = None
    upstream_writer: asyncio.StreamWriter | None = None
    lost_bytes: bool = False      # something was dropped: the stream has a hole
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class LinkProxy:
    def __init__(self, source: str, destination: str, target: str, listen_host: str = "127.0.0.1") -> None:
        self.source = source
        self.destination = destination
        host, _, port = target.rpartition(":")
        self.target_host, self.target_port = host, int(port)
        self.listen_host = listen_host
        self.state = HEALTHY
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        # Closes started from set_state (a sync call): held so they finish.
        self._closing: set[asyncio.Task[None]] = set()
        self.forwarded_bytes = 0
        self.dropped_bytes = 0

    @property
    def name(self) -> str:
        return f"{self.source}->{self.destination}"

    @property
    def address(self) -> str:
        assert self._server is not None, "start the proxy first"
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            await self._close(connection)
        if self._server is not None:
            await self._server.wait_closed()

    # ------------------------------------------------------------ control
    def set_state(self, state: LinkState) -> None:
        """Apply `state`; when a dropped direction heals, connections that lost
        bytes are closed (their streams have holes) and their peers reconnect."""
        healed = (self.state.drop_forward and not state.drop_forward) or \
                 (self.state.drop_backward and not state.drop_backward)
        self.state = state
        if healed:
            for connection in [c for c in self._connections if c.lost_bytes]:
                task = asyncio.ensure_future(self._close(connection))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def heal(self) -> None:
        self.set_state(HEALTHY)

    def retarget(self, target: str) -> None:
        """Forward to `target` from now on (the destination node was moved
        to a new address); connections to the old one are closed."""
        host, _, port = target.rpartition(":")
        self.target_host, self.target_port = host, int(port)
        for connection in list(self._connections):
            task = asyncio.ensure_future(self._close(connection))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # --------------------------------------------------------- connections
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader, writer)
        self._connections.add(connection)
        forward: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        connection.tasks = [
            asyncio.ensure_future(self._pump_in(reader, forward, forward_direction=True)),
            asyncio.ensure_future(self._deliver_forward(connection, forward)),
        ]

    async def _pump_in(self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]],
                       forward_direction: bool) -> None:
        """Read one direction and queue each chunk with the time it is due."""
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                delay = self.state.delay_forward_s if forward_direction else self.state.delay_backward_s
                await queue.put((time.monotonic() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((time.monotonic(), _EOF))

    async def _deliver_forward(self, connection: _Connection, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        while True:
            data = await self._next_due(queue)
            if self.state.drop_forward:
                self._drop(connection, data)
                if not data:
                    return
                continue
            if connection.upstream_writer is None and not await self._connect_upstream(connection):
                return
            if not await self._write(connection, connection.upstream_writer, data):
                return

    async def _deliver_backward(self, connection: _Connection, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        while True:
            data = await self._next_due(queue)
            if self.state.drop_backward:
                self._drop(connection, data)
                if not data:
                    return
                continue
            if not await self._write(connection, connection.client_writer, data):
                return

    async def _connect_upstream(self, connection: _Connection) -> bool:
        try:
            reader, writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            # The destination is down: the source sees its connection close,
            # as it would see a refused connection.
            await self._close(connection)
            return False
        connection.upstream_reader, connection.upstream_writer = reader, writer
        backward: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        connection.tasks += [
            asyncio.ensure_future(self._pump_in(reader, backward, forward_direction=False)),
            asyncio.ensure_future(self._deliver_backward(connection, backward)),
        ]
        return True

    @staticmethod
    async def _next_due(queue: asyncio.Queue[tuple[float, bytes]]) -> bytes:
        due, data = await queue.get()
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        return data

    def _drop(self, connection: _Connection, data: bytes) -> None:
        connection.lost_bytes = True
        self.dropped_bytes += len(data)

    async def _write(self, connection: _Connection, writer: asyncio.StreamWriter | None, data: bytes) -> bool:
        """Deliver `data` (an empty chunk is the end of the stream: close)."""
        if writer is None or not data:
            await self._close(connection)
            return False
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            await self._close(connection)
            return False
        self.forwarded_bytes += len(data)
        return True

    async def _close(self, connection: _Connection) -> None:
        if connection.closed:
            return
        connection.closed = True
        self._connections.discard(connection)
        current = asyncio.current_task()
        for task in connection.tasks:
            if task is not current:
                task.cancel()
        for writer in (connection.client_writer, connection.upstream_writer):
            if writer is not None:
                writer.close()
        for writer in (connection.client_writer, connection.upstream_writer):
            if writer is not None:
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()
