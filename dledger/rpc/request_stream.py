"""RequestStream: the calling end of a bidirectional gRPC stream that carries
requests and their answers correlated by id (the leader's PeerStream to a
follower, a client's AppendStream to the leader).

Requests are written in order, one write at a time (gRPC allows no more on a
call); a reader task hands each answer to the request with its id. Several
requests are in flight at once and answers may come back in any order.

A stream is never repaired. An answer that does not come within its
request's timeout, or a stream that breaks (a connection cut, a peer
restarted), fails every request waiting on it with StreamFailure; the owner
forgets the stream and opens a new one for the next request. An overdue
answer gives the whole stream up because, on an ordered connection, what is
behind it would wait as long (a partitioned link, a frozen peer).
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, Callable, Generic, TypeVar

import grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class StreamFailure(Exception):
    """The request's answer will not come on this stream (see `timed_out`)."""

    def __init__(self, why: str, timed_out: bool = False, code: grpc.StatusCode | None = None) -> None:
        super().__init__(why)
        self.timed_out = timed_out
        self.code = code   # the status that ended the call, when it ended with one


class AnsweredById(ABC, Generic[Req, Resp]):
    """Requests in flight on one ordered connection, each answered by a
    message with its id: the bookkeeping a RequestStream and a peer link
    (dledger/rpc/peer_link.py) share. A subclass sends, and says how to
    abort its connection."""

    def __init__(self, on_broken: Callable[[Any], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_broken = on_broken
        self._pending: dict[int, asyncio.Future[Resp]] = {}
        self._next_id = 1
        self.broken: StreamFailure | None = None

    async def request(self, message: Req, timeout: float) -> Resp:
        """Send `message` (its id is set here) and wait for its answer."""
        if self.broken is not None:
            raise self._failure()
        request_id = message.id = self._next_id  # type: ignore[attr-defined]
        self._next_id += 1
        future: asyncio.Future[Resp] = self._loop.create_future()
        self._pending[request_id] = future
        timer = self._loop.call_later(timeout, self._time_out, request_id, timeout)
        try:
            await self._send(message)
            return await future
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()   # seen: a caller cancelled meanwhile must not leave it to be logged

    @abstractmethod
    async def _send(self, message: Req) -> None:
        """Put `message` on the connection."""

    @abstractmethod
    def _abort(self) -> None:
        """Stop the connection (called once, by `close`)."""

    def _answered(self, response: Resp) -> None:
        future = self._pending.get(response.id)  # type: ignore[attr-defined]
        if future is not None and not future.done():
            future.set_result(response)

    def _time_out(self, request_id: int, timeout: float) -> None:
        if request_id in self._pending:
            self.close(f"no answer within {timeout:.2f}s", timed_out=True)

    def close(self, why: str, timed_out: bool = False, code: grpc.StatusCode | None = None) -> None:
        """Give the connection up: every request waiting on it fails with `why`."""
        if self.broken is not None:
            return
        self.broken = StreamFailure(why, timed_out, code)
        self._abort()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._failure())
        self._on_broken(self)

    def _failure(self) -> StreamFailure:
        """A fresh exception for each caller (one instance raised in many
        tasks would pile up their tracebacks)."""
        assert self.broken is not None
        return StreamFailure(str(self.broken), self.broken.timed_out, self.broken.code)


class RequestStream(AnsweredById[Req, Resp]):
    def __init__(self, call: Any, on_broken: Callable[["RequestStream[Req, Resp]"], None]) -> None:
        """`call`: a just-opened grpc.aio stream-stream call whose messages
        have an `id` field; `on_broken` runs once when the stream is given up."""
        super().__init__(on_broken)
        self._call = call
        self._write_lock = asyncio.Lock()
        self._reader = self._loop.create_task(self._read())

    async def _send(self, message: Req) -> None:
        """Write `message`; a failure closes the stream, which fails the
        message's future (the caller learns it there)."""
        async with self._write_lock:
            if self.broken is not None:
                return   # closed while this write waited: its future has failed already
            try:
                await self._call.write(message)
            except grpc.aio.AioRpcError as e:
                self.close(f"{e.code().name}: {e.details()}", code=e.code())
            except (asyncio.InvalidStateError, grpc.aio.BaseError) as e:
                self.close(f"the stream has ended ({type(e).__name__})")
            except asyncio.CancelledError:
                # A write cut short may leave half a message on the stream.
                self.close("a write was cancelled")
                raise

    async def _read(self) -> None:
        why, code = "the peer ended the stream", None
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                self._answered(response)
        except grpc.aio.AioRpcError as e:
            why, code = f"{e.code().name}: {e.details()}", e.code()
        except grpc.aio.BaseError as e:
            # A read on a call that broke under it (its channel closed, say)
            # fails with gRPC's own error rather than a status.
            why = f"the stream broke: {e}"
        except asyncio.CancelledError:
            why = "the stream was closed"
        self.close(why, code=code)

    def _abort(self) -> None:
        self._call.cancel()
        if self._reader is not asyncio.current_task():
            self._reader.cancel()
