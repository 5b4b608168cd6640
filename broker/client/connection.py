"""Connection: channels to the cluster, the client's identity, the leader, retries.

Every node serves the whole protocol (a follower forwards to the leader), but a
forwarded call costs the cluster a second hop and a follower's CPU, so the
client talks to the leader itself: it finds it with the DLedger Metadata RPC,
which every node serves on the same port, and forgets it on any failure that
suggests it moved. When no leader can be named (an election is running) it
asks any reachable node, which waits for the new leader or answers
HA_NOT_AVAILABLE.

Given front ends instead (broker/config.py: ports that serve the messaging
protocol only, never on the leader), the client cannot and need not find the
leader: a server that answers Metadata with UNIMPLEMENTED is a front end,
and the client sends everything to the first that answers, moving to the
next only when that one fails. The front end holds calls through leader
changes, so a leader that dies or stalls costs such a client latency, not a
retry; the price is the extra hop (docs/broker.md has the figures).

Retries use tenacity: short jittered waits, one overall deadline per call,
only for retriable failures (ClientError.retriable: unreachable, no quorum,
outcome unknown). A retried send carries the same message ids, which the
broker recognises, so a retry never stores a message twice.

Every call carries the headers of the RocketMQ 5 transport: x-mq-client-id
(required by the broker), x-mq-request-id, x-mq-language, x-mq-protocol,
x-mq-client-version, x-mq-date-time and, with a namespace, x-mq-namespace.
"""
from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import os
import socket
import time
import uuid
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay, wait_exponential_jitter

from broker.client.config import ClientConfig
from broker.client.errors import ClientError, RequestTimeoutError, UnavailableError, transport_error
from broker.client.link import MAX_LINK_REQUEST_BYTES, MessagingLink, MessagingLinks
from broker.client.watchdog import LeaderWatchdog
from dledger.rpc.channel import channel_options
from dledger.rpc.credentials import ClientSecurity
from rpcgen import dledger_pb2, dledger_pb2_grpc
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

log = logging.getLogger(__name__)

CLIENT_VERSION = "0.1.0"
# Many 4 MiB messages may travel in one batch (the 5.x proxy allows 130 MiB).
MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = channel_options(MAX_MESSAGE_BYTES, max_reconnect_backoff_ms=1000)
_client_index = itertools.count()
# A probe's answer from a front end: reachable, but it names no leader.
FRONT_END = object()

R = TypeVar("R")
Attempt = Callable[[str], Awaitable[R]]


def access_point(servers: Iterable[str]) -> pb.Endpoints:
    """The protocol's Endpoints for the servers a client was given."""
    addresses = []
    for server in servers:
        host, _, port = server.rpartition(":")
        addresses.append(pb.Address(host=host.strip("[]"), port=int(port)))
    kinds = {_ip_version(a.host) for a in addresses}
    scheme = pb.IPv4 if kinds == {4} else pb.IPv6 if kinds == {6} else pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=addresses)


def _ip_version(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


def make_client_id() -> str:
    """host@pid@index@random, the shape the official clients use."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_client_index)}@{uuid.uuid4().hex[:10]}"


class Connection:
    def __init__(self, config: ClientConfig, client_id: str | None = None, broker_name: str = "") -> None:
        self.config = config
        self.security = config.security if config.security is not None else ClientSecurity.from_env()
        self._signer = self.security.signer()
        self.client_id = client_id or make_client_id()
        # The broker group this connection serves, when the client talks to
        # several (broker/client/groups.py); "" for the configured servers.
        self.broker_name = broker_name
        self.servers = list(config.servers)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._messaging: dict[str, service_pb2_grpc.MessagingServiceStub] = {}
        self._leader: str | None = None
        self._discovery: asyncio.Task[str] | None = None
        # Metadata asked of a leader that another node named (for its link port).
        self._link_probes: dict[str, asyncio.Future[object]] = {}
        # Sends, receives and acks on the nodes' messaging links (broker/client/link.py).
        self.links = MessagingLinks(self.security, self.client_id, config.links)
        self.watchdog = LeaderWatchdog(self._probe_quietly, lambda: list(self.servers), config.leader_check_after_s)
        self.watchdog.on_moved = self._moved
        headers = [("x-mq-client-id", self.client_id), ("x-mq-language", "PYTHON"),
                   ("x-mq-protocol", "v2"), ("x-mq-client-version", CLIENT_VERSION)]
        if config.namespace:
            headers.append(("x-mq-namespace", config.namespace))
        self._headers = tuple(headers)
        self.closed = False
        # Attempts that failed retriably and were tried again (tests and
        # benchmarks read it: did a failover exercise the retry path?).
        self.retries = 0

    # ------------------------------------------------------------- channels
    def headers(self) -> tuple[tuple[str, str], ...]:
        if self._signer is not None:
            # x-mq-date-time and its signature (authorization), once a second.
            return self._headers + (("x-mq-request-id", uuid.uuid4().hex),) + self._signer.headers()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return self._headers + (("x-mq-request-id", uuid.uuid4().hex), ("x-mq-date-time", stamp))

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            options = CHANNEL_OPTIONS + list(self.config.channel_options)
            # Every call passes headers(), which carry the signature: no
            # signing interceptor (it would cost each call tens of microseconds).
            channel = self._channels[address] = self.security.channel(address, options, sign=False)
        return channel

    def messaging(self, address: str) -> service_pb2_grpc.MessagingServiceStub:
        stub = self._messaging.get(address)
        if stub is None:
            stub = self._messaging[address] = service_pb2_grpc.MessagingServiceStub(self.channel(address))
        return stub

    async def unary(self, address: str, method: str, request: Any, parse: Callable[[bytes], R], timeout: float) -> R:
        """A unary messaging call to `address`: on its messaging link when one
        is open, else on gRPC. `parse`: the response class's FromString."""
        on_link = self._on_link(address, request)
        if on_link is not None:
            return await self.links.unary(on_link[0], address, method, on_link[1], self.headers(), timeout, parse)
        return await getattr(self.messaging(address), method)(  # type: ignore[no-any-return]
            request, metadata=self.headers(), timeout=timeout)

    async def stream_on_link(self, address: str, method: str, request: Any, parse: Callable[[bytes], R],
                             timeout: float) -> list[R] | None:
        """A server-streaming messaging call's responses, on the messaging
        link to `address`; None when it is not to go there (the caller makes
        it on gRPC)."""
        on_link = self._on_link(address, request)
        if on_link is None:
            return None
        responses = await self.links.server_stream(on_link[0], address, method, on_link[1], self.headers(), timeout)
        return [parse(response) for response in responses]

    def _on_link(self, address: str, request: Any) -> tuple[MessagingLink, bytes] | None:
        """The link a call to `address` goes on and its request serialized;
        None (counted as a gRPC call) when no link has room or the request is
        too large for a frame."""
        link = self.links.get(address)
        if link is not None:
            data = request.SerializeToString()
            if len(data) <= MAX_LINK_REQUEST_BYTES:
                return link, data
        self.links.calls_by_path["grpc"] += 1
        return None

    def resource(self, name: str) -> pb.Resource:
        return pb.Resource(name=name, resource_namespace=self.config.namespace)

    async def close(self) -> None:
        self.closed = True
        if self._discovery is not None:
            self._discovery.cancel()
        for probe in list(self._link_probes.values()):
            probe.cancel()
        await self.watchdog.close()
        await self.links.close()
        channels, self._channels, self._messaging = list(self._channels.values()), {}, {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    # --------------------------------------------------------------- leader
    @property
    def known_leader(self) -> str | None:
        return self._leader

    async def leader(self) -> str:
        """The leader's address (or, during an election, any reachable node)."""
        if self._leader is not None:
            return self._leader
        # Concurrent callers share one discovery rather than each probing every node.
        if self._discovery is None or self._discovery.done():
            self._discovery = asyncio.ensure_future(self._discover())
        return await asyncio.shield(self._discovery)

    def forget(self, address: str) -> None:
        if self._leader == address:
            self._leader = None
            self.watchdog.leader = None

    def _moved(self, address: str, term: int) -> None:
        """The watchdog heard of a new leader."""
        self._leader = address
        self.watchdog.leader, self.watchdog.term = address, term
        self._learn_link_port(address)

    def _learn_link_port(self, leader: str) -> None:
        """A leader that another node named has not told its link port, which
        only its own Metadata answer carries: ask it, in the background.
        Without it every call to that leader stayed on gRPC (a client given
        one follower's address consumed at 5,200 messages a second against
        8,500 on the link)."""
        if not self.links.enabled or self.links.knows(leader) or self.closed or leader in self._link_probes:
            return
        probe = self._link_probes[leader] = asyncio.ensure_future(self._probe_quietly(leader))

        def done(finished: asyncio.Future[object]) -> None:
            self._link_probes.pop(leader, None)
            if not finished.cancelled() and finished.exception() is not None:
                log.debug("asking %s for its link port failed: %s", leader, finished.exception())
        probe.add_done_callback(done)

    async def refresh_leader(self) -> str:
        self._leader = None
        return await self.leader()

    async def _discover(self) -> str:
        servers = list(self.servers)
        answers = await asyncio.gather(*(self._probe(a) for a in servers))
        best: tuple[int, int, str] | None = None  # (term, says it leads, address)
        reachable = []
        front_ends = [address for address, answer in zip(servers, answers) if answer is FRONT_END]
        for address, answer in zip(servers, answers):
            if not isinstance(answer, dledger_pb2.MetadataResponse):
                continue
            reachable.append(address)
            self._learn(peer.address for peer in answer.peers)
            if answer.role == "LEADER":
                candidate = (answer.term, 1, address)
            elif answer.leader_address:
                candidate = (answer.term, 0, answer.leader_address)
            else:
                continue
            if best is None or candidate[:2] > best[:2]:
                best = candidate
        if best is not None:
            self._leader = best[2]
            self.watchdog.leader, self.watchdog.term = best[2], best[0]
            self._learn_link_port(best[2])
            return best[2]
        if front_ends:
            # Kept like a leader: every call goes there until it fails (the
            # front end, not the watchdog, follows the leader).
            self._leader = front_ends[0]
            return front_ends[0]
        if reachable:
            return reachable[0]  # no leader yet: a node that waits for one
        raise UnavailableError(pb.HA_NOT_AVAILABLE, f"no node reachable among {','.join(servers)}")

    async def _probe(self, address: str) -> dledger_pb2.MetadataResponse | object | None:
        """The node's Metadata; FRONT_END for a front end; None if unreachable."""
        stub = dledger_pb2_grpc.DLedgerServiceStub(self.channel(address))
        try:
            answer = await stub.Metadata(dledger_pb2.MetadataRequest(header=dledger_pb2.Header()),
                                         metadata=self.headers(), timeout=self.config.probe_timeout_s)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                # Reachable but refused: retrying will not help; say why.
                raise ClientError(pb.UNAUTHORIZED, f"{address}: {error.details()}") from None
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                return FRONT_END
            return None
        if answer.header.code != 200:
            return None
        self.links.learn(address, answer)
        return answer

    async def _probe_quietly(self, address: str) -> object:
        try:
            return await self._probe(address)
        except ClientError:
            return None

    def _learn(self, addresses: Any) -> None:
        for address in addresses:
            if address and address not in self.servers:
                self.servers.append(address)

    # -------------------------------------------------------------- retries
    async def call(self, what: str, attempt: Attempt[R], retry: Callable[[ClientError], bool] | None = None,
                   long_poll: bool = False) -> R:
        """Run `attempt(address)` against the leader, retrying retriable
        failures (or those `retry` accepts) until the deadline. `long_poll`:
        the attempt may wait for its answer by design (a receive)."""
        should_retry = retry or (lambda error: error.retriable)
        try:
            return await self._attempt(what, attempt, long_poll)  # the common case, without a retry state
        except ClientError as error:
            if self.closed or not should_retry(error):
                raise
            log.debug("%s: %s; retrying", what, error)
            self.retries += 1
        return await self.retrying(should_retry)(self._attempt, what, attempt, long_poll)

    async def _attempt(self, what: str, attempt: Attempt[R], long_poll: bool = False) -> R:
        address = await self.leader()
        try:
            with self.watchdog.watch(address, long_poll) as watch:
                try:
                    return await attempt(address)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if not watch.given_up or task is None or task.uncancel() > 0:
                        raise
                    raise RequestTimeoutError(pb.REQUEST_TIMEOUT, f"{what}: the leader moved away from {address} "
                                                                  "before it answered; trying again") from None
        except grpc.aio.AioRpcError as error:
            self.forget(address)
            raise transport_error(error, address, what) from None
        except UnavailableError:
            self.forget(address)  # it may have stepped down: ask again who leads
            raise

    def retrying(self, should_retry: Callable[[ClientError], bool]) -> AsyncRetrying:
        config = self.config

        def retriable(error: BaseException) -> bool:
            return isinstance(error, ClientError) and not self.closed and should_retry(error)

        def before_sleep(state: RetryCallState) -> None:
            self.retries += 1
            failure = state.outcome.exception() if state.outcome else None
            log.debug("retry %d after %s", state.attempt_number, failure)

        return AsyncRetrying(stop=stop_after_delay(config.deadline_s),
                             wait=wait_exponential_jitter(multiplier=config.retry_initial_s, max=config.retry_max_s,
                                                          jitter=config.retry_initial_s),
                             retry=retry_if_exception(retriable), reraise=True, before_sleep=before_sleep)
