"""A follower serves clients by forwarding their calls to the leader.

RocketMQ's official clients send everything for a route to one endpoint set,
picking the first address that answers, so any node may receive any call.
Writes (and pop consumption, which writes) must be done by the leader, so a
follower relays them over gRPC to the leader's peer address, unchanged, with
the client's own metadata, and relays the answer back. During an election it
waits up to `leader_wait_s` for a leader before answering HA_NOT_AVAILABLE.
A forwarded call is marked and never forwarded again: a node that receives
one while not leading answers HA_NOT_AVAILABLE, and the client retries.

A leader that stops answering (paused, cut off) is not waited out: when this
node learns of another leader, or of the same one in a later term, while a
forwarded call has no answer yet, the call is abandoned and answered
PROXY_TIMEOUT (its outcome is unknown: the old leader may have written it),
which the edge (broker/service.py) tries again through the new leader for
the calls whose repetition is harmless. So a paused leader costs a held call
about one election, not the call's whole deadline. `leader_moved` is the
rule; `LeaderWatch` applies it whenever the member state changes.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

import grpc
from google.protobuf import message_factory

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.relay import RelayCallError, RelayClient
from dledger.rpc import tls
from dledger.rpc.channel import channel_options
from dledger.rpc.credentials import signed_headers
from dledger.member_state import MemberState
from dledger.server import DLedgerServer
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

log = logging.getLogger(__name__)

FORWARDED_HEADER = "x-pydledger-forwarded"
# Request headers gRPC itself sets; everything else is the client's.
_TRANSPORT_HEADERS = ("grpc-", ":", "user-agent", "te", "content-type")
MAX_MESSAGE_BYTES = 130 << 20  # the 5.x proxy's inbound limit: 4 MiB x 32 + 2 MiB
CHANNEL_OPTIONS = channel_options(MAX_MESSAGE_BYTES, max_reconnect_backoff_ms=500)
POLL_S = 0.02
# Builds the stub a call is relayed with: the messaging service's by default;
# the admin service passes its own (both live on every node's port).
StubFactory = Callable[[grpc.aio.Channel], Any]
_MESSAGING = spb.DESCRIPTOR.services_by_name["MessagingService"]


@dataclass(frozen=True)
class Target:
    """Where a call was forwarded: the leader as this node knew it then."""
    address: str
    leader_id: str
    term: int


def leader_moved(target: Target, leader_id: str, term: int) -> bool:
    """Whether a call forwarded to `target` should be abandoned, this node now
    knowing `leader_id` in `term`: another leader is known, or the same one in
    a later term (it stepped down and was elected again; its pending writes
    of the old term have failed). Not while no leader is known: an election
    may fail, and the old leader may still answer."""
    return bool(leader_id) and (leader_id, term) != (target.leader_id, target.term)


class LeaderWatch:
    """Forwarded calls without an answer yet, each with the leader it went
    to; when the member state changes (every change of role, term or leader
    goes through its listeners), those whose leader moved are abandoned.
    A dict entry per call, no task: the hot path stays cheap."""

    def __init__(self, member_state: MemberState) -> None:
        self.member_state = member_state
        self._waiting: dict[int, tuple[Target, Callable[[], None]]] = {}
        self._keys = itertools.count()
        self.abandoned = 0
        member_state.add_listener(self._on_change)

    def _on_change(self, *_: object) -> None:
        ms = self.member_state
        for key, (target, abandon) in list(self._waiting.items()):
            if leader_moved(target, ms.leader_id, ms.term):
                del self._waiting[key]
                self.abandoned += 1
                log.info("a call forwarded to %s (term %d) is abandoned: %s leads in term %d", target.leader_id,
                         target.term, ms.leader_id, ms.term)
                abandon()

    @contextlib.contextmanager
    def guard(self, target: Target, abandon: Callable[[], None]) -> Iterator[None]:
        """Within the block, `abandon()` is called if the leader moves from `target`."""
        ms = self.member_state
        if leader_moved(target, ms.leader_id, ms.term):
            abandon()
            yield
            return
        key = next(self._keys)
        self._waiting[key] = (target, abandon)
        try:
            yield
        finally:
            self._waiting.pop(key, None)


class _Abandonable:
    """One forwarded call's abandonment: cancels it and remembers why."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.abandoned = False

    def __call__(self) -> None:
        self.abandoned = True
        self.call.cancel()

    def outcome(self, error: grpc.aio.AioRpcError | RelayCallError | asyncio.CancelledError, method: str,
                target: Target,
                member_state: MemberState) -> BaseException:
        """What the forwarded call's failure becomes: PROXY_TIMEOUT when it
        was abandoned, the cancellation itself when the caller went away,
        else the relay's failure."""
        if self.abandoned:
            return BrokerError(pb.PROXY_TIMEOUT, f"the leader changed from {target.leader_id} (term {target.term}) "
                                                 f"to {member_state.leader_id} (term {member_state.term}) under the "
                                                 f"forwarded {method}; its outcome is unknown, retry")
        if isinstance(error, asyncio.CancelledError):
            return error
        return _relay_failure(method, error)


class LeaderForwarder:
    def __init__(self, server: DLedgerServer, config: BrokerConfig, material: tls.TlsMaterial = tls.PLAINTEXT,
                 signing: tuple[str, str] | None = None) -> None:
        """`signing`: the node's own credentials (the super user's): the relay
        stream is opened with them where the leader's port checks them, each
        call on it carrying its client's own."""
        self.server = server
        self.config = config
        # The leader's peer address is a members-only mutual-TLS port when
        # the node has the cluster CA.
        self._tls = material
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._relays: dict[str, RelayClient] = {}
        self._retired = (0, 0)   # calls and messages of relays closed since (the metrics are totals)
        self._closing: set[asyncio.Task[None]] = set()
        self._relay_headers = signed_headers(*signing) if signing else None
        self.watch = LeaderWatch(server.member_state)

    def is_leader(self) -> bool:
        return self.server.member_state.is_leader

    def counts(self) -> tuple[int, int, int]:
        """Calls relayed, relay messages written, calls abandoned (metrics)."""
        relays = list(self._relays.values())
        return (self._retired[0] + sum(r.calls for r in relays), self._retired[1] + sum(r.messages for r in relays),
                self.watch.abandoned)

    @staticmethod
    def was_forwarded(context: grpc.aio.ServicerContext) -> bool:
        return any(key == FORWARDED_HEADER for key, _ in context.invocation_metadata() or ())

    async def close(self) -> None:
        relays, self._relays = list(self._relays.values()), {}
        await asyncio.gather(*(relay.close() for relay in relays), return_exceptions=True)
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)

    # ---------------------------------------------------------------- calls
    async def unary(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                    stub_factory: StubFactory = service_pb2_grpc.MessagingServiceStub,
                    give_up: float | None = None) -> Any:
        if stub_factory is service_pb2_grpc.MessagingServiceStub and self.config.relay_forwarded_calls:
            return await self._relayed(method, request, context, give_up)
        stub, metadata, timeout, target = await self._target(method, context, stub_factory, give_up)
        call = getattr(stub, method)(request, metadata=metadata, timeout=timeout)
        abandon = _Abandonable(call)
        try:
            with self.watch.guard(target, abandon):
                return await call
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as error:
            raise abandon.outcome(error, method, target, self.server.member_state) from None

    async def _relayed(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                       give_up: float | None) -> Any:
        """`unary`, on the relay stream to the leader (broker/relay.py)."""
        _, metadata, timeout, target = await self._target(method, context, None, give_up)
        relay = self._relay(target.address)
        pending = relay.submit(f"/{_MESSAGING.full_name}/{method}", request.SerializeToString(), metadata, timeout)
        abandon = _Abandonable(pending)
        try:
            with self.watch.guard(target, abandon):
                answer = await relay.answer(pending, timeout)
        except (RelayCallError, asyncio.CancelledError) as error:
            raise abandon.outcome(error, method, target, self.server.member_state) from None
        return _response_class(method).FromString(answer)

    async def server_stream(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                            give_up: float | None = None) -> AsyncIterator[Any]:
        stub, metadata, timeout, target = await self._target(method, context, give_up=give_up)
        call = getattr(stub, method)(request, metadata=metadata, timeout=timeout)
        abandon = _Abandonable(call)
        try:
            responses = call.__aiter__()
            # The answer comes in one go once the leader has it (a receive
            # streams its status and messages after its leases are
            # committed): only the wait for its start may be abandoned.
            try:
                with self.watch.guard(target, abandon):
                    first = await responses.__anext__()
            except StopAsyncIteration:
                return
            yield first
            async for response in responses:
                yield response
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as error:
            raise abandon.outcome(error, method, target, self.server.member_state) from None
        finally:
            call.cancel()

    async def bidi_stream(self, method: str, requests: AsyncIterator[Any],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        stub, metadata, _, target = await self._target(method, context)
        call = getattr(stub, method)(requests, metadata=metadata)
        abandon = _Abandonable(call)
        try:
            # A session (Telemetry) lives on the leader: when another one is
            # elected the stream ends, and the relay attaches it there.
            with self.watch.guard(target, abandon):
                async for response in call:
                    yield response
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as error:
            raise abandon.outcome(error, method, target, self.server.member_state) from None
        finally:
            call.cancel()

    # ------------------------------------------------------------- plumbing
    async def _target(self, method: str, context: grpc.aio.ServicerContext,
                      stub_factory: StubFactory | None = service_pb2_grpc.MessagingServiceStub,
                      give_up: float | None = None) -> tuple[Any, list[tuple[str, str]], float | None, Target]:
        """`give_up` (time.monotonic()): wait for a leader until then rather
        than `leader_wait_s` (a call the edge holds through an election).
        No stub without a `stub_factory` (a relayed call needs none)."""
        if self.was_forwarded(context):
            raise BrokerError(pb.HA_NOT_AVAILABLE, f"{self.server.config.self_id} received a forwarded "
                                                   f"{method} but does not lead; retry")
        wait_s = self.config.leader_wait_s if give_up is None else max(0.0, give_up - time.monotonic())
        target = await self._leader(wait_s)
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()
                    if not k.startswith(_TRANSPORT_HEADERS)]
        metadata.append((FORWARDED_HEADER, self.server.config.self_id))
        remaining = context.time_remaining()
        if give_up is not None:
            # Leave the edge time to try the next leader if this one fails.
            remaining = max(0.05, give_up - time.monotonic())
        timeout = min(remaining, self.config.forward_timeout_s) if remaining is not None else None
        stub = stub_factory(self._channel(target.address)) if stub_factory is not None else None
        return stub, metadata, timeout, target

    def _relay(self, address: str) -> RelayClient:
        relay = self._relays.get(address)
        if relay is None:
            self._retire_idle_relays()
            relay = self._relays[address] = RelayClient(self._channel(address), self._relay_headers)
        return relay

    def _retire_idle_relays(self) -> None:
        """A relay opens to a new leader: those to nodes that led before hold a
        stream, and a handler on that node, for nothing. Each is closed once
        no call waits on it (one that still has calls is left to finish; the
        next leader change looks again)."""
        for address, relay in list(self._relays.items()):
            if relay.idle:
                del self._relays[address]
                self._retired = (self._retired[0] + relay.calls, self._retired[1] + relay.messages)
                task = asyncio.get_running_loop().create_task(relay.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def _leader(self, wait_s: float) -> Target:
        """The leader and its peer address (peers reach each other there, even
        where clients use other, advertised, addresses), waiting out an election."""
        ms = self.server.member_state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            if ms.leader_id and ms.leader_id != self.server.config.self_id:
                return Target(self.server.address_of(ms.leader_id), ms.leader_id, ms.term)
            if ms.is_leader:
                return Target(self.server.config.self_peer.address, ms.leader_id, ms.term)
            if loop.time() >= deadline:
                raise BrokerError(pb.HA_NOT_AVAILABLE, "no leader is elected yet; retry")
            await asyncio.sleep(POLL_S)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = tls.channel(address, CHANNEL_OPTIONS, material=self._tls)
        return channel


def _response_class(method: str) -> Any:
    # protobuf keeps the class on the descriptor: no cache of our own needed.
    return message_factory.GetMessageClass(_MESSAGING.methods_by_name[method].output_type)


def _relay_failure(method: str, error: grpc.aio.AioRpcError | RelayCallError) -> BrokerError:
    """A leader that cannot be reached (it died, an election runs) is an
    availability problem the client's retry fixes."""
    code, details = (error.code, error.details) if isinstance(error, RelayCallError) \
        else (error.code(), error.details())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return BrokerError(pb.HA_NOT_AVAILABLE, f"forwarding {method} to the leader failed: {details}; retry")
    return BrokerError(pb.INTERNAL_SERVER_ERROR, f"forwarding {method} to the leader failed: "
                                                 f"{code.name}: {details}")
