"""The relay: forwarded unary calls sharing one stream to the leader.

A follower forwards its clients' calls to the leader (broker/forwarding.py).
A unary gRPC call costs each end several times what a message on an open
stream costs (`python -m bench.grpc_floor`), and the official RocketMQ
clients make a call per message sent or acked, so with 128 sends in flight
through a front end the leader and the front end spent most of their CPU in
gRPC's per-call work. Here a follower sends its forwarded unary calls to the
leader on one `RelayService.Calls` stream: the calls made in one event-loop
turn share one stream message (proto/pydledger/relay/v1/relay.proto), and
the leader's answers that are ready together share one back.

`RelayClient` is the follower's end, one per leader address. `RelayServicer`
is the leader's: each relayed call runs in its own task through
`RelayedHandlers`, which resolve a method to the handler the server would
have run for it, behind the same interceptors (namespaces, authentication and
ACLs, where the port that serves the relay has them), with a `RelayContext`
that gives the handler the client's metadata, the caller's deadline and the
relay's peer, exactly what a forwarded unary call gave it.

A broken stream fails the calls waiting on it as a failed unary call would
(UNAVAILABLE: the edge answers HA_NOT_AVAILABLE or tries the next leader);
the next call opens a new stream. A call whose caller stops waiting (its
deadline passed, its client went away, the leader moved) is withdrawn if
still queued, else cancelled on the leader (`RelayRequest.cancelled`), and
the leader cancels a call past its deadline by itself: as gRPC cancels a
unary call's handler, so that a send given up on cannot store its message
after its retry has (the retry's dedupe does not see a message not yet
applied).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

import grpc

from dledger.rpc.handler_capture import HandlerCapture
from dledger.rpc.stream_server import OpenStreams
from rpcgen.pydledger.relay.v1 import relay_pb2 as rpb
from rpcgen.pydledger.relay.v1 import relay_pb2_grpc

log = logging.getLogger(__name__)

RELAY_SERVICE = rpb.DESCRIPTOR.services_by_name["RelayService"].full_name
RELAY_METHOD = f"/{RELAY_SERVICE}/Calls"
# Calls (answers) per stream message, and their bytes: a message of many
# large calls stays far below the channels' limits (130 MiB on a follower's
# channel to the leader), whatever each call alone may carry; a call larger
# than MAX_MESSAGE_BYTES goes alone.
MAX_PER_MESSAGE = 512
MAX_MESSAGE_BYTES = 16 << 20


def _take(queue: list[Any], size: Callable[[Any], int]) -> tuple[list[Any], list[Any]]:
    """The next stream message's share of `queue` (at least one item), and the rest."""
    total = 0
    for n, item in enumerate(queue[:MAX_PER_MESSAGE]):
        total += size(item)
        if n and total > MAX_MESSAGE_BYTES:
            return queue[:n], queue[n:]
    return queue[:MAX_PER_MESSAGE], queue[MAX_PER_MESSAGE:]


class RelayCallError(Exception):
    """A relayed call ended without an answer: `code` as a unary call would have ended."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


_CODES = {code.value[0]: code for code in grpc.StatusCode}


# ==================================================================== client
class RelayClient:
    """The follower's end of one relay stream to one leader address.

    Calls are written as they come while fewer than `window` stream messages
    have calls still unanswered; beyond that, new calls wait (at most
    `max_hold_s`) and then go together. An idle relay adds no wait, and a busy
    one sends as many calls per message as arrive during a commit, the way
    the leader's pushes and group commit batch (the official clients make a
    call per message, each arriving on its own)."""

    def __init__(self, channel: grpc.aio.Channel,
                 headers: Callable[[], Sequence[tuple[str, str]]] | None = None,
                 window: int = 2, max_hold_s: float = 0.005) -> None:
        """`headers`: the metadata that signs the stream itself (a port with
        authentication lets only super users relay)."""
        self._stub = relay_pb2_grpc.RelayServiceStub(channel)
        self._headers = headers
        self.window = window
        self.max_hold_s = max_hold_s
        self._call: Any = None
        self._pending: dict[int, asyncio.Future[rpb.RelayedAnswer]] = {}
        self._queue: list[rpb.RelayedCall] = []
        # Calls written whose callers stopped waiting: the leader is told to cancel them.
        self._cancels: list[int] = []
        self._queued_at = 0.0
        self._wakeup = asyncio.Event()
        self._freed = asyncio.Event()
        # Calls written and not settled: call id -> the stream message that
        # carried it; and per such message, how many of its calls are left.
        self._written: dict[int, int] = {}
        self._unanswered: dict[int, int] = {}
        self._next_id = 1
        self._tasks: list[asyncio.Task[None]] = []
        self.messages = 0           # stream messages written, and the calls in them (tests, benchmarks)
        self.calls = 0

    @property
    def idle(self) -> bool:
        """No call waits on this relay."""
        return not self._pending and not self._queue

    async def call(self, method: str, request: bytes, metadata: Sequence[tuple[str, str]],
                   timeout: float | None) -> bytes:
        """Relay one unary call; its serialized answer, or RelayCallError
        with the status it ended with."""
        return await self.answer(self.submit(method, request, metadata, timeout), timeout)

    def submit(self, method: str, request: bytes, metadata: Sequence[tuple[str, str]],
               timeout: float | None) -> asyncio.Future[rpb.RelayedAnswer]:
        """Queue one call; the future is its answer. Cancelling it (or its
        timeout in `answer`) withdraws the call, or, once written, has the
        leader cancel it, as a cancelled unary call is cancelled there."""
        self._open()
        call_id = self._next_id
        self._next_id += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[rpb.RelayedAnswer] = loop.create_future()
        self._pending[call_id] = future
        future.add_done_callback(lambda done: self._settled(call_id, done))
        if not self._queue:
            self._queued_at = loop.time()
        self._queue.append(rpb.RelayedCall(
            id=call_id, method=method, request=request, timeout_s=timeout or 0.0,
            metadata=[rpb.Header(key=k, value=v) for k, v in metadata]))
        self._wakeup.set()
        return future

    def _settled(self, call_id: int, future: asyncio.Future[rpb.RelayedAnswer]) -> None:
        """A call answered, failed or given up on: out of the window's count;
        if given up on, withdrawn while still queued, else cancelled on the leader."""
        self._pending.pop(call_id, None)
        number = self._written.pop(call_id, None)
        if number is not None:
            left = self._unanswered.pop(number) - 1
            if left:
                self._unanswered[number] = left
            else:
                self._freed.set()
        if not future.cancelled() or self._call is None:
            return
        if number is None:
            self._queue = [queued for queued in self._queue if queued.id != call_id]
            return
        self._cancels.append(call_id)
        self._wakeup.set()

    @staticmethod
    async def answer(future: asyncio.Future[rpb.RelayedAnswer], timeout: float | None) -> bytes:
        """Wait for a submitted call's answer, at most `timeout` seconds."""
        try:
            answer = await (asyncio.wait_for(future, timeout) if timeout is not None else future)
        except asyncio.TimeoutError:
            raise RelayCallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        if answer.code != grpc.StatusCode.OK.value[0]:
            raise RelayCallError(_CODES.get(answer.code, grpc.StatusCode.UNKNOWN), answer.details)
        return answer.response

    def _open(self) -> None:
        if self._call is not None:
            return
        self._call = self._stub.Calls(metadata=tuple(self._headers()) if self._headers is not None else None)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._write_loop(self._call)), loop.create_task(self._read_loop(self._call))]

    async def _write_loop(self, call: Any) -> None:
        """Write what is queued, all of it in one message, once the window
        allows (see the class). It runs a loop turn after a call was queued
        at the earliest, so the calls made in that turn ride together."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue or self._cancels:
                    held = self._queued_at + self.max_hold_s - loop.time()
                    if self._queue and len(self._unanswered) >= self.window and held > 0:
                        if self._cancels:
                            await self._write(call, with_calls=False)   # cancellations do not wait
                        self._freed.clear()
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._freed.wait(), held)
                        continue
                    await self._write(call)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any failed write breaks the stream for every call on it
            self._broken(call, f"the relay stream broke on a write: {error}")

    async def _write(self, call: Any, with_calls: bool = True) -> None:
        cancelled, self._cancels = self._cancels, []
        if not with_calls:
            await call.write(rpb.RelayRequest(cancelled=cancelled))
            return
        batch, self._queue = _take(self._queue, lambda relayed: len(relayed.request))
        self._queued_at = asyncio.get_running_loop().time()
        number = self.messages
        self.messages += 1
        self.calls += len(batch)
        for relayed in batch:   # every queued call is pending: a settled one left the queue
            self._written[relayed.id] = number
        if batch:
            self._unanswered[number] = len(batch)
        await call.write(rpb.RelayRequest(calls=batch, cancelled=cancelled))

    async def _read_loop(self, call: Any) -> None:
        why = "the leader ended the relay stream"
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                for answer in response.answers:
                    future = self._pending.get(answer.id)
                    if future is not None and not future.done():
                        future.set_result(answer)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            why = f"the relay stream ended: {error.code().name}: {error.details()}"
        except Exception as error:  # noqa: BLE001 - gRPC's own errors on a call that broke under the read
            why = f"the relay stream broke: {error}"
        self._broken(call, why)

    def _broken(self, call: Any, why: str) -> None:
        """Fail every call waiting on `call`; the next call opens a new stream."""
        if call is not self._call:
            return
        self._call = None
        call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        pending, self._pending, self._queue = self._pending, {}, []
        self._written.clear()
        self._unanswered.clear()
        self._cancels = []
        for future in pending.values():
            if not future.done():
                future.set_exception(RelayCallError(grpc.StatusCode.UNAVAILABLE, why))

    async def close(self) -> None:
        if self._call is not None:
            self._broken(self._call, "the relay is closing")
        await asyncio.gather(*self._tasks, return_exceptions=True)


# ==================================================================== server
class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str], ...] = ()


class RelayedHandlers:
    """Which handler runs a relayed call: the servicers' own, behind the
    interceptors the relaying port applies (made when first needed: the
    authentication interceptor needs the broker's users)."""

    def __init__(self, register: Iterable[Callable[[Any], None]],
                 interceptors: Callable[[], list[grpc.aio.ServerInterceptor]]) -> None:
        capture = HandlerCapture()
        for add in register:
            add(capture)
        self._generic = capture.generic
        self._interceptors = interceptors
        self._chain: list[grpc.aio.ServerInterceptor] | None = None
        self._resolved: dict[str, Any] = {}

    async def handler(self, method: str) -> Any:
        found = self._resolved.get(method)
        if found is not None:
            return found
        if self._chain is None:
            self._chain = self._interceptors()
        details = _CallDetails(method)

        async def innermost(details: grpc.HandlerCallDetails) -> Any:
            for generic in self._generic:
                handler = generic.service(details)
                if handler is not None:
                    return handler
            return None

        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]] = innermost
        for interceptor in reversed(self._chain):
            continuation = _bound(interceptor, continuation)
        handler = await continuation(details)
        if handler is not None:
            # Interceptors wrap a method the same way whatever its metadata
            # (they read it per call, from the context).
            self._resolved[method] = handler
        return handler


def _bound(interceptor: grpc.aio.ServerInterceptor, inner: Callable[[grpc.HandlerCallDetails], Awaitable[Any]]
           ) -> Callable[[grpc.HandlerCallDetails], Awaitable[Any]]:
    async def call(details: grpc.HandlerCallDetails) -> Any:
        return await interceptor.intercept_service(inner, details)
    return call


class RelayAbort(Exception):
    """A relayed handler's context.abort()."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class RelayContext:
    """What a handler reads of its call, for a relayed one: the client's
    metadata, the deadline the follower passed on, the relay's peer; and
    abort(). That is all the messaging servicer and the namespace and auth
    interceptors use of a call's context."""

    def __init__(self, metadata: tuple[tuple[str, str], ...], timeout_s: float, peer: str) -> None:
        self._metadata = metadata
        self._deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise RelayAbort(code, details)


class RelayServicer(relay_pb2_grpc.RelayServiceServicer):
    def __init__(self, handlers: RelayedHandlers, streams: OpenStreams | None = None) -> None:
        self.handlers = handlers
        # A stopping leader ends its relay streams once their calls are
        # answered (calls not read yet fail UNAVAILABLE, never started).
        self.streams = streams or OpenStreams()

    async def Calls(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        """Each call runs in a task of its own, cancelled (unanswered) when the
        follower withdraws it or its deadline passes, as gRPC cancels a unary
        call's handler: a send whose caller gave up must not go on to store
        its message after the caller's retry did (its retry's dedupe does
        not see a message not yet applied)."""
        answers = _Answers(context)
        running: dict[int, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        peer = context.peer()
        try:
            while True:
                try:
                    request = await self.streams.read(context)
                except grpc.aio.BaseError:
                    return
                if request is grpc.aio.EOF:
                    break
                for call in request.calls:
                    task = loop.create_task(self._run(call, peer, answers))
                    running[call.id] = task
                    task.add_done_callback(lambda _, call_id=call.id: running.pop(call_id, None))
                    if call.timeout_s > 0:
                        deadline = loop.call_later(call.timeout_s, task.cancel)
                        task.add_done_callback(lambda _, deadline=deadline: deadline.cancel())
                for call_id in request.cancelled:
                    withdrawn = running.get(call_id)
                    if withdrawn is not None:
                        withdrawn.cancel()
            if running:
                await asyncio.gather(*running.values(), return_exceptions=True)
            await answers.drained()
        finally:
            for task in list(running.values()):
                task.cancel()
            answers.close()

    async def _run(self, call: rpb.RelayedCall, peer: str, answers: "_Answers") -> None:
        try:
            answers.add(await self._answer(call, peer))
        except asyncio.CancelledError:
            pass   # withdrawn or past its deadline: the follower waits for no answer

    async def _answer(self, call: rpb.RelayedCall, peer: str) -> rpb.RelayedAnswer:
        return await answer_call(self.handlers, call, peer, streams=False)


async def answer_call(handlers: RelayedHandlers, call: rpb.RelayedCall, peer: str,
                      streams: bool) -> rpb.RelayedAnswer:
    """Run `call` as the server would run it arriving on its own (its
    handler behind the interceptors, a RelayContext) and answer it.
    `streams`: a server-streaming call is run too, its responses in
    `responses` (a client's messaging link); the relay carries unary calls
    only."""
    handler = await handlers.handler(call.method)
    if handler is None or handler.request_streaming or (handler.response_streaming and not streams):
        return rpb.RelayedAnswer(id=call.id, code=grpc.StatusCode.UNIMPLEMENTED.value[0],
                                 details=f"{call.method} cannot be relayed")
    context = RelayContext(tuple((h.key, h.value) for h in call.metadata), call.timeout_s, peer)
    try:
        request = handler.request_deserializer(call.request) if handler.request_deserializer else call.request
        if handler.response_streaming:
            serialize = handler.response_serializer or (lambda response: response)
            answer = rpb.RelayedAnswer(id=call.id)
            answer.responses.extend([serialize(r) async for r in handler.unary_stream(request, context)])
            return answer
        response = await handler.unary_unary(request, context)
        data = handler.response_serializer(response) if handler.response_serializer else response
        return rpb.RelayedAnswer(id=call.id, response=data)
    except RelayAbort as abort:
        return _failed(call.id, abort.code, abort.details)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - as gRPC answers a handler that raised
        log.exception("relayed %s failed", call.method)
        return _failed(call.id, grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}: {error}")


def _failed(call_id: int, code: grpc.StatusCode, details: str) -> rpb.RelayedAnswer:
    return rpb.RelayedAnswer(id=call_id, code=code.value[0], details=details)


class _Answers:
    """The leader's outbox on one relay stream: answers ready while a write
    runs go out together in the next one."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._ready: list[rpb.RelayedAnswer] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    def add(self, answer: rpb.RelayedAnswer) -> None:
        self._ready.append(answer)
        self._idle.clear()
        self._wakeup.set()

    async def drained(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        self._writer.cancel()

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._ready:
                    batch, self._ready = _take(self._ready, lambda answer: len(answer.response))
                    await self._context.write(rpb.RelayResponse(answers=batch))
                self._idle.set()
        except grpc.aio.BaseError:
            self._idle.set()   # the call ended under the write: the follower failed those calls already
