"""PeerStream: replication on one long-lived bidirectional gRPC stream per
follower, both ends.

A unary call costs Python gRPC several hundred microseconds of CPU at each
end (a new HTTP/2 stream, its headers, a deadline, a task on the server); a
message on a stream that is already open costs a fraction of that. So the
leader's pushes and heartbeats to a follower go out as messages on one open
stream, several in flight, and the follower writes each answer back on it
with the id of the request it answers.

The follower answers every request in its own task, so an APPEND waiting for
its fsync holds up neither the heartbeat behind it nor the next APPEND
(exactly as concurrent unary calls did); tasks start in arrival order, so the
synchronous part of each (the write of an APPEND's entries) happens in order.

A stream is not repaired: a request that gets no answer in time, or a
stream that breaks (a connection cut, a peer restarted), fails every request
still waiting on it with TransportError, exactly what a unary call's deadline
or a broken connection gave the caller (the dispatcher backs off and goes back
to COMPARE), and the next request opens a new stream. The follower cancels
the tasks of a stream that ended, as gRPC cancels a unary handler whose call
ended.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable

import grpc

from dledger.rpc.edge import answer
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

log = logging.getLogger(__name__)


class PeerStream:
    """The leader's end of one open PeerStream call: requests written in
    order, answers matched to their requests by id."""

    def __init__(self, stub: dledger_pb2_grpc.DLedgerServiceStub, on_broken: Callable[[PeerStream], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._call = stub.PeerStream()
        self._on_broken = on_broken
        self._pending: dict[int, asyncio.Future[pb.PeerStreamResponse]] = {}
        self._next_id = 1
        # gRPC allows one write at a time on a call.
        self._write_lock = asyncio.Lock()
        self.broken: str | None = None
        self._reader = self._loop.create_task(self._read())

    async def request(self, message: pb.PeerStreamRequest, timeout: float) -> pb.PeerStreamResponse:
        """Send `message` and wait for its answer; TransportError when the
        answer does not come within `timeout` or the stream breaks."""
        if self.broken is not None:
            raise TransportError(self.broken)
        request_id = message.id = self._next_id
        self._next_id += 1
        future: asyncio.Future[pb.PeerStreamResponse] = self._loop.create_future()
        self._pending[request_id] = future
        timer = self._loop.call_later(timeout, self._time_out, request_id, timeout)
        try:
            await self._write(message)
            return await future
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)

    async def _write(self, message: pb.PeerStreamRequest) -> None:
        async with self._write_lock:
            if self.broken is not None:
                raise TransportError(self.broken)
            try:
                await self._call.write(message)
            except grpc.aio.AioRpcError as e:
                self.close(f"{e.code().name}: {e.details()}")
            except asyncio.InvalidStateError:
                self.close("the stream has ended")
            except asyncio.CancelledError:
                # A write cut short may leave half a message on the stream.
                self.close("a write was cancelled")
                raise

    def _time_out(self, request_id: int, timeout: float) -> None:
        # An answer overdue on an ordered stream means the link (or the peer)
        # is stuck: everything behind it would wait as long, so the stream is
        # given up and the next request opens a new one.
        if request_id in self._pending:
            self.close(f"no answer within {timeout:.2f}s")

    async def _read(self) -> None:
        why = "the peer ended the stream"
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                future = self._pending.get(response.id)
                if future is not None and not future.done():
                    future.set_result(response)
        except grpc.aio.AioRpcError as e:
            why = f"{e.code().name}: {e.details()}"
        except asyncio.CancelledError:
            why = "the stream was closed"
        self.close(why)

    def close(self, why: str) -> None:
        """Give the stream up: every request waiting on it fails with `why`."""
        if self.broken is not None:
            return
        self.broken = why
        self._call.cancel()
        if self._reader is not asyncio.current_task():
            self._reader.cancel()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(TransportError(why))
        self._on_broken(self)


async def serve_peer_stream(server: DLedgerServer, context: grpc.aio.ServicerContext) -> None:
    """The follower's end: answer each request of the stream in its own task,
    until the leader ends the stream or goes away."""
    write_lock = asyncio.Lock()
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    try:
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                break
            kind = request.WhichOneof("body")
            if kind is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"PeerStream request {request.id} carries neither a push nor a heartbeat")
            task = loop.create_task(_answer_one(server, context, write_lock, request, kind))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _answer_one(server: DLedgerServer, context: grpc.aio.ServicerContext, write_lock: asyncio.Lock,
                      request: pb.PeerStreamRequest, kind: str) -> None:
    response = pb.PeerStreamResponse(id=request.id)
    if kind == "push":
        push = request.push
        response.push.CopyFrom(await answer("Push", server.member_state, push, pb.PushEntryResponse,
                                            lambda: server.handle_push(push)))
    else:
        heartbeat = request.heartbeat
        response.heartbeat.CopyFrom(await answer("HeartBeat", server.member_state, heartbeat,
                                                 pb.HeartBeatResponse, lambda: server.handle_heartbeat(heartbeat)))
    async with write_lock:
        await context.write(response)
