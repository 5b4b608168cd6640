"""DLedgerClient: the asyncio client library behind the CLI, the benchmarks and
other packages.

It keeps one gRPC channel per server, finds the leader with Metadata, caches
it, follows NOT_LEADER answers, and retries across a leader change with
tenacity: short jittered waits (20 ms growing to 200 ms) bounded by one overall
deadline per call (10 s by default), trying every server it knows.

Appends are idempotent by default, as in Kafka's producer: the client names
itself with a random producer id and numbers its Append requests; the group
remembers, in the replicated log itself, which (producer, sequence) pairs it
holds, and answers a repeated one with the original indexes. So an append
whose answer was lost (a timeout, TERM_CHANGED, a connection broken after the
request left, a leader killed) is simply retried until the deadline, without
storing anything twice. With `producer_id=""` the client is not idempotent and
retries only where the entry was surely not appended.

Appends travel as messages on one long-lived AppendStream to the leader
(dledger/rpc/append_stream.py), answered by id as they commit: a message on an
open stream costs Python gRPC a fraction of a unary call. Concurrent append()
calls are coalesced, as Kafka's producer batches records: calls made in the
same event-loop turn (or within `linger_s`, 0 by default) leave together in
one message, at most MAX_COALESCED_ENTRIES / MAX_COALESCED_BYTES per message
(a full batch leaves at once), and while `max_inflight_appends` messages are
in flight the calls that arrive queue up for the next one. Each caller gets
its own outcome: the leader checks each caller's bodies on their own, so one
caller's oversized body fails that caller only. `coalesce=False` sends one
message per call.

Once an AppendStream answer names the leader's client link port
(dledger/rpc/client_link.py), the client dials that link in the background
and sends its appends there as the same messages on a TCP connection of its
own (about half the cost of a gRPC stream message each way); a link that
cannot be dialed or is refused leaves the client on AppendStream
(`links=False`: always).
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, TypeVar

import grpc
from tenacity import (AsyncRetrying, RetryCallState, retry_if_exception,
                      stop_after_delay, wait_exponential_jitter)

from dledger.entry import INDEX_RECORD_SIZE, run_indexes
from dledger.errors import DLedgerError, ResponseCode
from dledger.rpc.channel import channel_options
from dledger.rpc.client_link import ClientLink, client_tls_context, open_client_link
from dledger.rpc.credentials import ClientSecurity
from dledger.rpc.link import (LINK_DIAL_TIMEOUT_S, LINK_REFUSED_RETRY_S, LINK_RETRY_S, MAX_FRAME_BYTES,
                              LinkDialer)
from dledger.rpc.request_stream import RequestStream, StreamFailure
from dledger.servers import parse_servers  # re-exported: the client's callers take it from here
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

log = logging.getLogger(__name__)

# A client batch may carry many entries close to the 4 MiB entry limit.
MAX_MESSAGE_BYTES = 256 << 20

CHANNEL_OPTIONS = channel_options(MAX_MESSAGE_BYTES, max_reconnect_backoff_ms=1000)

# The leader moved, is moving or is not there yet: asking again (elsewhere)
# will work, and the request was surely not applied.
LEADER_MOVED = frozenset({
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_NOT_READY,
    ResponseCode.TERM_NOT_READY,
    # No leader can be elected without losing committed entries: tried again
    # until the deadline (a node that holds them may come back), then raised.
    ResponseCode.NO_INTACT_COPY,
})
# The request may or may not have been applied.
OUTCOME_UNKNOWN = frozenset({
    ResponseCode.TERM_CHANGED,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
    ResponseCode.TIMEOUT,
})
# Retries for requests that change nothing (metadata, get, read).
READ_RETRY = LEADER_MOVED | OUTCOME_UNKNOWN | {ResponseCode.NETWORK_ERROR}
# Retries for appends without a producer id: only where a retry cannot duplicate.
# DISK_FULL: nothing was written, and a leader whose disk is full steps down
# for one that can write (a whole cluster out of space still fails, at the deadline).
APPEND_RETRY = LEADER_MOVED | {ResponseCode.NETWORK_ERROR, ResponseCode.LEADER_PENDING_FULL, ResponseCode.DISK_FULL}
# With a producer id the group recognises a repeated request, so an unknown
# outcome is retried too.
IDEMPOTENT_APPEND_RETRY = APPEND_RETRY | OUTCOME_UNKNOWN

# Membership changes: adding a member at the same address again is a no-op on
# the server, so an unknown outcome is retried; so is a change that waits for
# the one before it (a promotion) to commit.
MEMBERSHIP_RETRY = LEADER_MOVED | OUTCOME_UNKNOWN | {ResponseCode.NETWORK_ERROR,
                                                     ResponseCode.MEMBERSHIP_CHANGE_IN_PROGRESS}
# How often `add_member` looks whether the new member was promoted.
PROMOTION_POLL_S = 0.1

# Leader discovery: once one node claims to lead, others get this long to
# name a higher term.
DISCOVERY_GRACE_S = 0.1

# Coalescing limits: AppendStream messages in flight per client, and what one carries.
MAX_INFLIGHT_APPENDS = 4
MAX_COALESCED_ENTRIES = 2000
MAX_COALESCED_BYTES = 4 << 20

# The bodies one message may carry on a link: its frames' limit, less room
# for the message's own fields. A larger append (up to the gRPC limit,
# MAX_MESSAGE_BYTES) goes on AppendStream.
LINK_MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - (1 << 20)

R = TypeVar("R")
Stub = dledger_pb2_grpc.DLedgerServiceStub


@dataclass(frozen=True)
class AppendResult:
    first_index: int
    last_index: int
    positions: list[int]


def rpc_error(error: grpc.aio.AioRpcError, address: str) -> DLedgerError:
    """Translate a transport failure into the one error vocabulary."""
    code = error.code()
    detail = error.details() or code.name
    if code == grpc.StatusCode.UNAVAILABLE:
        return DLedgerError(ResponseCode.NETWORK_ERROR, f"{address} unavailable: {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DLedgerError(ResponseCode.TIMEOUT, f"{address} did not answer in time")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{address}: {detail}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return DLedgerError(ResponseCode.UNAUTHENTICATED, f"{address} refused the credentials: {detail}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return DLedgerError(ResponseCode.FORBIDDEN, f"{address}: {detail}")
    return DLedgerError(ResponseCode.INTERNAL_ERROR, f"{address}: {code.name}: {detail}")


def member_json(member: pb.Member) -> dict[str, str]:
    data = {"id": member.id, "address": member.address, "role": member.role}
    if member.client_address:
        data["client_address"] = member.client_address
    return data


def header_error(header: pb.Header, address: str) -> DLedgerError | None:
    """A DLedgerError for a non-200 response header, or None on success."""
    if header.code == ResponseCode.SUCCESS:
        return None
    code = ResponseCode.of(header.code)
    message = header.message or code.name
    if code == ResponseCode.UNKNOWN:
        message = f"code {header.code}: {message}"
    return DLedgerError(code, f"{address}: {message}", leader_id=header.leader_id,
                        leader_address=header.leader_address)


def node_status_row(address: str, metadata: pb.MetadataResponse | None,
                    known_id: str | None = None) -> dict[str, Any]:
    """One node of `dledger status --json`; an unreachable node keeps only its
    address (and its id when a peer list told us) with role "unreachable"."""
    if metadata is None:
        return {
            "id": known_id, "address": address, "pid": None, "role": "unreachable",
            "term": None, "leader_id": None, "ledger_begin_index": None,
            "ledger_end_index": None, "committed_index": None, "metrics_address": None,
            "repairing": None, "repair_until": None, "no_intact_copy": None,
        }
    return {
        "id": metadata.self_id,
        "address": address,
        "pid": metadata.pid or None,
        "role": metadata.role,
        "term": metadata.term,
        "leader_id": metadata.leader_id or None,
        "ledger_begin_index": metadata.ledger_begin_index,
        "ledger_end_index": metadata.ledger_end_index,
        "committed_index": metadata.committed_index,
        "metrics_address": metadata.metrics_address or None,
        "repairing": metadata.repairing,
        "repair_until": metadata.repair_until if metadata.repairing else None,
        # Why no leader can be elected without losing committed entries.
        "no_intact_copy": metadata.no_intact_copy or None,
    }


@dataclass
class _QueuedAppend:
    """One append() call waiting for a coalesced message."""
    bodies: list[bytes]
    size: int
    future: asyncio.Future[AppendResult] = field(repr=False)


@dataclass
class _ReadCursor:
    """Where a range read stands, so that a broken stream resumes after the
    last entry delivered (committed entries never change, so this is safe)."""
    next_index: int
    end_index: int
    include_system: bool = False
    raw: bool = False
    max_batch_bytes: int = 0
    call: Any = None


class DLedgerClient:
    def __init__(self, servers: str | Iterable[str], group: str = "default", *,
                 deadline_s: float = 10.0, probe_timeout_s: float = 1.0,
                 append_timeout_s: float = 5.0, call_timeout_s: float = 3.0,
                 producer_id: str | None = None, coalesce: bool = True,
                 max_inflight_appends: int = MAX_INFLIGHT_APPENDS, linger_s: float = 0.0,
                 security: ClientSecurity | None = None, links: bool = True) -> None:
        self.servers = parse_servers(servers)
        # Credentials and the CA (DLEDGER_USER, DLEDGER_SECRET_FILE,
        # DLEDGER_TLS_CA when not given).
        self.security = ClientSecurity.from_env() if security is None else security
        self._signer = self.security.signer()
        self.group = group
        # None: a fresh random id (idempotent); "": not idempotent.
        self.producer_id = uuid.uuid4().hex if producer_id is None else producer_id
        self._next_sequence = 0
        self.coalesce = coalesce
        self.max_inflight_appends = max_inflight_appends
        self._append_queue: deque[_QueuedAppend] = deque()
        self._appends_in_flight = 0
        self._append_tasks: set[asyncio.Task[None]] = set()
        self.linger_s = linger_s
        self._linger: asyncio.Handle | None = None
        self._queued_bytes = 0
        self._queued_entries = 0
        self._append_streams: dict[Stub, RequestStream[pb.AppendStreamRequest, pb.AppendStreamResponse]] = {}
        self._unary_append_stubs: set[Stub] = set()   # servers of an earlier version, without AppendStream
        # Client links (dledger/rpc/client_link.py), by the server's stub.
        self.links = links
        self._dialer: LinkDialer[Stub, ClientLink] = LinkDialer("client link", "AppendStream", LINK_RETRY_S,
                                                                LINK_REFUSED_RETRY_S)
        self._links = self._dialer.links
        self._link_context: ssl.SSLContext | None = None
        self._client_id = self.producer_id or uuid.uuid4().hex   # names the client in a link's hello
        # Append messages sent, by the path they took (tests, benchmarks).
        self.appends_by_path = {"link": 0, "stream": 0, "unary": 0}
        self.deadline_s = deadline_s
        self.probe_timeout_s = probe_timeout_s
        # Longer than the server's max_wait_ack_s (2.5 s), so that a slow
        # commit is answered by the server's WAIT_QUORUM_ACK_TIMEOUT.
        self.append_timeout_s = append_timeout_s
        self.call_timeout_s = call_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Stub] = {}
        self._addresses: dict[Stub, str] = {}
        self._leader_address: str | None = None
        self._leader_id: str | None = None

    async def __aenter__(self) -> "DLedgerClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        for stream in list(self._append_streams.values()):
            stream.close("the client was closed")
        await self._dialer.close("the client was closed")
        for task in list(self._append_tasks):
            task.cancel()
        await asyncio.gather(*self._append_tasks, return_exceptions=True)
        while self._append_queue:
            queued = self._append_queue.popleft()
            if not queued.future.done():
                queued.future.set_exception(DLedgerError(ResponseCode.NETWORK_ERROR, "the client was closed"))
        channels, self._channels, self._stubs, self._addresses = list(self._channels.values()), {}, {}, {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    # ------------------------------------------------------------ client RPCs

    async def append(self, bodies: list[bytes]) -> AppendResult:
        """Append `bodies` as consecutive entries; returns once all are committed."""
        if not bodies:
            raise DLedgerError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "nothing to append")
        if not self.coalesce:
            response = await self._append_message([bodies])
            return self._outcome_of(response, 0, 0)
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        queued = _QueuedAppend(bodies, sum(len(b) for b in bodies), future)
        self._append_queue.append(queued)
        self._queued_bytes += queued.size
        self._queued_entries += len(bodies)
        if self._queued_bytes >= MAX_COALESCED_BYTES or self._queued_entries >= MAX_COALESCED_ENTRIES:
            self._send_queued_appends()
        elif self._linger is None:
            # Linger (Kafka's linger.ms): calls made in the same event-loop
            # turn (or within linger_s) leave together. With linger_s = 0 a
            # lone call waits for no clock, only for the turn to end.
            loop = asyncio.get_running_loop()
            self._linger = (loop.call_later(self.linger_s, self._linger_over) if self.linger_s > 0
                            else loop.call_soon(self._linger_over))
        return await future

    def _linger_over(self) -> None:
        self._linger = None
        self._send_queued_appends()

    def _send_queued_appends(self) -> None:
        """Send the queued calls, coalesced, while fewer than the limit fly;
        what queues meanwhile leaves as soon as one comes back."""
        while self._append_queue and self._appends_in_flight < self.max_inflight_appends:
            batch = [self._append_queue.popleft()]
            entries, size = len(batch[0].bodies), batch[0].size
            while self._append_queue:
                following = self._append_queue[0]
                if entries + len(following.bodies) > MAX_COALESCED_ENTRIES or \
                        size + following.size > MAX_COALESCED_BYTES:
                    break
                batch.append(self._append_queue.popleft())
                entries, size = entries + len(following.bodies), size + following.size
            self._queued_bytes -= size
            self._queued_entries -= entries
            self._appends_in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send_coalesced(batch))
            self._append_tasks.add(task)
            task.add_done_callback(self._append_tasks.discard)

    async def _send_coalesced(self, batch: list[_QueuedAppend]) -> None:
        try:
            try:
                response = await self._append_message([queued.bodies for queued in batch])
            except DLedgerError as error:
                for queued in batch:
                    if not queued.future.done():
                        queued.future.set_exception(error)
                return
            offset = 0
            for number, queued in enumerate(batch):
                result: AppendResult | DLedgerError
                try:
                    result = self._outcome_of(response, number, offset)
                except DLedgerError as error:   # this caller's bodies were refused
                    result = error
                else:
                    offset += len(queued.bodies)
                if queued.future.done():
                    continue
                if isinstance(result, DLedgerError):
                    queued.future.set_exception(result)
                else:
                    queued.future.set_result(result)
        finally:
            self._appends_in_flight -= 1
            self._send_queued_appends()

    @staticmethod
    def _outcome_of(response: pb.AppendStreamResponse, number: int, offset: int) -> AppendResult:
        """Caller `number`'s result (its bodies' positions start at `offset`
        among the appended ones), or its refusal raised."""
        outcome = response.outcomes[number]
        if outcome.code != ResponseCode.SUCCESS:
            raise DLedgerError(ResponseCode.of(outcome.code), outcome.message or ResponseCode.of(outcome.code).name)
        count = outcome.last_index - outcome.first_index + 1
        return AppendResult(outcome.first_index, outcome.last_index, list(response.positions[offset:offset + count]))

    async def _append_message(self, callers: list[list[bytes]]) -> pb.AppendStreamResponse:
        """One AppendStream message carrying these callers' bodies (retried as
        one, with one sequence number); the answer has an outcome per caller
        (checked here, so that every caller is answered)."""
        sequence = self._next_sequence
        self._next_sequence += 1
        bodies = callers[0] if len(callers) == 1 else [body for bodies in callers for body in bodies]
        request = pb.AppendStreamRequest(counts=[len(bodies) for bodies in callers] if len(callers) > 1 else ())
        append = request.append   # filled in place: a submessage given to a constructor is copied
        append.header.group = self.group
        append.bodies.extend(bodies)
        append.producer_id = self.producer_id
        append.sequence = sequence if self.producer_id else -1
        first_sent: list[float] = []
        fits_a_link = sum(map(len, bodies)) <= LINK_MAX_PAYLOAD_BYTES

        async def call(stub: Stub) -> pb.AppendStreamResponse:
            # Every attempt after the first is a retry: the leader recognises
            # it within its duplicate window, so it says how old it is.
            if first_sent:
                append.retry_age_ms = max(1, int((time.monotonic() - first_sent[0]) * 1000))
            else:
                first_sent.append(time.monotonic())
            link = self._links.get(stub) if fits_a_link else None
            if link is not None:
                self.appends_by_path["link"] += 1
                try:
                    return await link.request(request, self.append_timeout_s)
                except StreamFailure as failure:
                    code = ResponseCode.TIMEOUT if failure.timed_out else ResponseCode.NETWORK_ERROR
                    raise DLedgerError(code, f"append link: {failure}") from None
            if stub not in self._unary_append_stubs:
                self.appends_by_path["stream"] += 1
                try:
                    response = await self._append_stream(stub).request(request, self.append_timeout_s)
                except StreamFailure as failure:
                    if failure.code != grpc.StatusCode.UNIMPLEMENTED:
                        code = ResponseCode.TIMEOUT if failure.timed_out else ResponseCode.NETWORK_ERROR
                        raise DLedgerError(code, f"append stream: {failure}") from None
                    # A server of an earlier version: unary Append from now on.
                    self._unary_append_stubs.add(stub)
                else:
                    self._learn_link(stub, response)
                    return response
            self.appends_by_path["unary"] += 1
            answer = await stub.Append(append, metadata=self._signed(), timeout=self.append_timeout_s)
            return _as_stream_response(answer, [len(bodies) for bodies in callers])

        response = await self._on_leader(call, IDEMPOTENT_APPEND_RETRY if self.producer_id else APPEND_RETRY)
        if len(response.outcomes) != len(callers):
            raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"the leader answered {len(response.outcomes)} "
                               f"outcomes for {len(callers)} callers")
        return response

    def _append_stream(self, stub: Stub) -> RequestStream[pb.AppendStreamRequest, pb.AppendStreamResponse]:
        """The open AppendStream to the server behind `stub` (opened on first use
        and again after a failure)."""
        stream = self._append_streams.get(stub)
        if stream is None:
            def forget(broken: RequestStream) -> None:
                if self._append_streams.get(stub) is broken:
                    del self._append_streams[stub]
            # Signed once, when the stream opens: the server checks a call's
            # credentials at its start.
            stream = self._append_streams[stub] = RequestStream(stub.AppendStream(metadata=self._signed()), forget)
        return stream

    def _learn_link(self, stub: Stub, response: pb.AppendStreamResponse) -> None:
        """Dial the link a successful AppendStream answer names, in the
        background (no append waits for a dial), unless one is open, being
        dialed, or resting after a failed dial."""
        if (not self.links or not response.link_port or response.header.code != ResponseCode.SUCCESS
                or not self._dialer.may_dial(stub)):
            return
        server = self._addresses[stub]
        host = server.rpartition(":")[0]
        address = f"{host}:{response.link_port}"
        if self.security.ca and self._link_context is None:
            self._link_context = client_tls_context(self.security.ca)
        signing = (self.security.user, self.security.secret) if self.security.user else None
        # Kept once dialed unless the client was closed meanwhile.
        self._dialer.dial(stub, server, address, lambda on_broken: open_client_link(
            address, host.strip("[]"), self.group, self._client_id, signing, self._link_context,
            LINK_DIAL_TIMEOUT_S, on_broken), lambda: stub in self._addresses)

    async def append_one(self, body: bytes) -> AppendResult:
        return await self.append([body])

    async def get(self, index: int) -> pb.Entry:
        request = pb.GetRequest(header=self._header(), index=index)

        async def call(stub: Stub) -> pb.GetResponse:
            return await stub.Get(request, metadata=self._signed(), timeout=self.call_timeout_s)

        return (await self._on_leader(call, READ_RETRY)).entry

    async def read(self, start: int = -1, end: int = -1, from_id: str | None = None,
                   include_system: bool = False, from_address: str | None = None) -> AsyncIterator[pb.Entry]:
        """Committed entries start..end inclusive (-1: the begin index / the
        committed index when the read starts), from the leader or, with
        `from_id` (or `from_address`), from that node's own log, which holds
        only what that node has committed. `include_system` adds the log's
        own entries (term NOOPs, producer marks)."""
        cursor = _ReadCursor(next_index=start, end_index=end, include_system=include_system)
        address = from_address or (await self._address_of(from_id) if from_id else None)
        try:
            while True:
                response = await self._retrying(READ_RETRY)(self._next_batch, cursor, address)
                if response is None:
                    return
                for entry in response.entries:
                    yield entry
                if response.entries:
                    cursor.next_index = response.entries[-1].index + 1
        finally:
            self._cancel(cursor)

    async def read_raw(self, start: int = -1, end: int = -1, from_address: str | None = None,
                       max_batch_bytes: int = 0) -> AsyncIterator[tuple[bytes, bytes]]:
        """read(), as stored: (index records, entry bytes) of runs of
        back-to-back entries (about max_batch_bytes each; 0: the node's
        default), every entry of the range included (the log's own too).
        Not CRC-checked by the node: the caller checks them."""
        cursor = _ReadCursor(next_index=start, end_index=end, raw=True, max_batch_bytes=max_batch_bytes)
        try:
            while True:
                response = await self._retrying(READ_RETRY)(self._next_batch, cursor, from_address)
                if response is None:
                    return
                records = response.raw_records
                if len(records) < INDEX_RECORD_SIZE or len(records) % INDEX_RECORD_SIZE:
                    raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"a raw read answered {len(records)} bytes of "
                                                                    f"index records")
                yield records, response.raw_data
                cursor.next_index = run_indexes(records)[1] + 1
        finally:
            self._cancel(cursor)

    async def metadata(self, server: str) -> pb.MetadataResponse | None:
        """`server`'s own view, or None when it cannot be reached."""
        request = pb.MetadataRequest(header=self._header())
        try:
            response = await self._stub(server).Metadata(request, metadata=self._signed(),
                                                         timeout=self.probe_timeout_s)
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise rpc_error(error, server) from None  # reachable, but refused: say why
            log.debug("metadata from %s failed: %s", server, rpc_error(error, server))
            return None
        failure = header_error(response.header, server)
        if failure is not None:
            raise failure
        return response

    async def cluster_status(self) -> list[dict[str, Any]]:
        """One row per node: the given servers first, then peers they name."""
        probed: dict[str, pb.MetadataResponse | None] = {}
        peer_ids: dict[str, str] = {}
        pending = list(self.servers)
        while pending:
            answers = await asyncio.gather(*(self.metadata(a) for a in pending))
            probed.update(zip(pending, answers))
            for answer in answers:
                for peer in answer.peers if answer else ():
                    peer_ids.setdefault(peer.address, peer.id)
            pending = [a for a in peer_ids if a not in probed]
        reachable_ids = {a.self_id for a in probed.values() if a is not None}
        rows: list[dict[str, Any]] = []
        seen_ids: set[str] = set()
        for address, answer in probed.items():
            row = node_status_row(address, answer, peer_ids.get(address))
            # One node may be both given (localhost:P) and named by its peers
            # (127.0.0.1:P): list it once.
            if answer is not None:
                if row["id"] in seen_ids:
                    continue
                seen_ids.add(row["id"])
            elif row["id"] in reachable_ids:
                continue
            rows.append(row)
        return rows

    async def leadership_transfer(self, to_id: str) -> tuple[str, int]:
        """Hand leadership to `to_id`; returns (leader id, term) once a node
        reports `to_id` as leader."""
        request = pb.LeadershipTransferRequest(
            header=self._header(), transferee_id=to_id, from_leader=False)

        async def call(stub: Stub) -> pb.LeadershipTransferResponse | None:
            if self._leader_id == to_id:
                return None  # done already (a retry after the hand-over)
            return await stub.LeadershipTransfer(request, metadata=self._signed(), timeout=self.append_timeout_s)

        await self._on_leader(call, LEADER_MOVED | {ResponseCode.NETWORK_ERROR})
        return await self._retrying(READ_RETRY)(self._confirm_leader, to_id)

    # ------------------------------------------------------------ membership

    async def members(self) -> list[dict[str, str]]:
        """The leader's configuration: [{"id", "address", "role"}], role "voter" or "learner"."""
        request = pb.ListMembersRequest(header=self._header())

        async def call(stub: Stub) -> pb.ListMembersResponse:
            return await stub.ListMembers(request, metadata=self._signed(), timeout=self.call_timeout_s)

        response = await self._on_leader(call, READ_RETRY)
        return [member_json(m) for m in response.members]

    async def add_member(self, member_id: str, address: str, wait_for_voter: bool = True,
                         timeout_s: float = 60.0, client_address: str = "") -> list[dict[str, str]]:
        """Add a server (peer address HOST:PORT), started with --join. It joins
        as a learner; with `wait_for_voter`, return once the leader has
        promoted it (it caught up), else once the learner entry is committed.
        `client_address`: where clients reach it (needed under mutual TLS,
        where peers have ports of their own)."""
        members = await self._change_membership(pb.ADD_MEMBER, member_id, address, client_address)
        if not wait_for_voter:
            return members
        deadline = time.monotonic() + timeout_s
        while True:
            members = await self.members()
            role = next((m["role"] for m in members if m["id"] == member_id), None)
            if role == "voter":
                return members
            if role is None:
                raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{member_id} is no longer a member")
            if time.monotonic() > deadline:
                raise DLedgerError(ResponseCode.TIMEOUT, f"{member_id} was added but is still a learner after "
                                   f"{timeout_s:.0f} s: is it running, started with --join, and reachable "
                                   f"at {address}?")
            await asyncio.sleep(PROMOTION_POLL_S)

    async def remove_member(self, member_id: str) -> list[dict[str, str]]:
        """Remove a member (voter or learner); returns once the removal is committed."""
        return await self._change_membership(pb.REMOVE_MEMBER, member_id, "")

    async def move_member(self, member_id: str, address: str, client_address: str = "") -> list[dict[str, str]]:
        """Give a member a new peer address under the same id and role (its
        machine was replaced); returns once committed. The leader refuses
        (ILLEGAL_MEMBER_STATE) while it still hears from the member at its
        old address: tried again until the deadline, as a server that just
        died is heard from until two election timeouts have passed."""
        return await self._change_membership(pb.MOVE_MEMBER, member_id, address, client_address,
                                             retry=MEMBERSHIP_RETRY | {ResponseCode.ILLEGAL_MEMBER_STATE})

    async def replace_member(self, member_id: str, address: str, new_id: str = "",
                             timeout_s: float = 60.0, client_address: str = "") -> list[dict[str, str]]:
        """Replace a (dead) member by a server at `address`, one server at a
        time. Without `new_id` (or with the same id) the member is moved:
        one configuration entry, the voters unchanged, and the server at the
        new address counts once it has caught up. With another id the new
        server is added first (a learner, promoted once caught up), then the
        old one removed, so the group never has fewer voters than before.
        A retry after a failure carries on from where the group stands.
        `client_address`: where clients reach the new server (required
        under mutual TLS, whose peer ports clients cannot use)."""
        if not new_id or new_id == member_id:
            return await self.move_member(member_id, address, client_address)
        members = {m["id"]: m for m in await self.members()}
        if members.get(new_id, {}).get("role") != "voter":
            await self.add_member(new_id, address, wait_for_voter=True, timeout_s=timeout_s,
                                  client_address=client_address)
        elif members[new_id]["address"] != address:
            raise DLedgerError(ResponseCode.UNEXPECTED_MEMBER,
                               f"{new_id} is already a member at {members[new_id]['address']}, not {address}")
        if member_id not in members and not any(m["id"] == member_id for m in await self.members()):
            return await self.members()
        return await self.remove_member(member_id)

    async def _change_membership(self, action: int, member_id: str, address: str, client_address: str = "",
                                 retry: frozenset[ResponseCode] = MEMBERSHIP_RETRY) -> list[dict[str, str]]:
        request = pb.ChangeMembershipRequest(header=self._header(), action=action, member_id=member_id,
                                             address=address, client_address=client_address)
        attempts = [0]

        async def call(stub: Stub) -> pb.ChangeMembershipResponse:
            attempts[0] += 1
            return await stub.ChangeMembership(request, metadata=self._signed(), timeout=self.append_timeout_s)

        try:
            response = await self._on_leader(call, retry)
        except DLedgerError as error:
            # A retried removal whose first attempt was applied after all.
            if action == pb.REMOVE_MEMBER and attempts[0] > 1 and error.code is ResponseCode.UNKNOWN_MEMBER:
                return await self.members()
            raise
        return [member_json(m) for m in response.members]

    async def leader(self) -> tuple[str, str]:
        """(leader id, leader address), discovering it when unknown."""
        async def find() -> tuple[str, str]:
            if self._leader_address is None:
                await self._discover_leader()
            assert self._leader_address is not None
            return self._leader_id or "", self._leader_address
        return await self._retrying(READ_RETRY)(find)

    # ---------------------------------------------------------- leader finding

    async def _on_leader(self, call: Callable[[Stub], Awaitable[R]],
                         retry_codes: frozenset[ResponseCode] | set[ResponseCode]) -> R:
        if self._leader_address is not None:
            # The common case, without building a retry state per call: the
            # cached leader answers.
            try:
                return await self._attempt_on_leader(call)
            except DLedgerError as failure:
                if failure.code not in retry_codes:
                    raise
        return await self._retrying(retry_codes)(self._attempt_on_leader, call)

    async def _attempt_on_leader(self, call: Callable[[Stub], Awaitable[R]]) -> R:
        if self._leader_address is None:
            await self._discover_leader()
        address = self._leader_address
        assert address is not None
        try:
            response = await call(self._stub(address))
        except grpc.aio.AioRpcError as error:
            failure = rpc_error(error, address)
            if failure.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT):
                self._forget_leader(address)
            raise failure from None
        except DLedgerError as failure:   # a stream's call fails with these itself
            if failure.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT):
                self._forget_leader(address)
            raise
        if response is not None:
            self._check(response.header, address)
        return response

    async def _discover_leader(self) -> None:
        """Ask every known server; believe the highest term's leader. Once a
        node says it leads, the others get a short grace to name a higher term,
        not the full probe timeout: a frozen node must not slow every failover."""
        servers = list(self.servers)
        probes = {asyncio.ensure_future(self.metadata(a)): a for a in servers}
        answers: dict[str, pb.MetadataResponse | None] = {}
        refusal: BaseException | None = None
        pending = set(probes)
        try:
            while pending:
                claimed = any(a is not None and a.role == "LEADER" for a in answers.values())
                done, pending = await asyncio.wait(
                    pending, timeout=DISCOVERY_GRACE_S if claimed else None, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for probe in done:
                    failure = probe.exception()
                    if failure is not None:   # reachable, but refused (credentials)
                        refusal = failure
                    answers[probes[probe]] = None if failure is not None else probe.result()
        finally:
            for probe in pending:
                probe.cancel()
        best: tuple[int, int, str, str] | None = None  # (term, self-reported, address, id)
        for address, answer in answers.items():
            if answer is None:
                continue
            self._learn(p.address for p in answer.peers)
            if answer.role == "LEADER":
                candidate = (answer.term, 1, address, answer.self_id)
            elif answer.leader_address:
                candidate = (answer.term, 0, answer.leader_address, answer.leader_id)
            else:
                continue
            if best is None or candidate[:2] > best[:2]:
                best = candidate
        if best is None:
            if refusal is not None:
                raise refusal
            if all(a is None for a in answers.values()):
                raise DLedgerError(ResponseCode.NETWORK_ERROR,
                                   f"no server reachable among {','.join(self.servers)}")
            why = next((f"{a.self_id}: {a.no_intact_copy}" for a in answers.values()
                        if a is not None and a.no_intact_copy), "")
            if why:
                raise DLedgerError(ResponseCode.NO_INTACT_COPY, why)
            raise DLedgerError(ResponseCode.NOT_LEADER, "no leader elected yet")
        self._set_leader(best[2], best[3])

    async def _address_of(self, node_id: str) -> str:
        """The address of node `node_id`, from any reachable node's peer list."""
        async def find() -> str:
            answers = await asyncio.gather(*(self.metadata(a) for a in list(self.servers)))
            for address, answer in zip(list(self.servers), answers):
                if answer is None:
                    continue
                if answer.self_id == node_id:
                    return address
                for peer in answer.peers:
                    if peer.id == node_id:
                        return peer.address
            if all(a is None for a in answers):
                raise DLedgerError(ResponseCode.NETWORK_ERROR,
                                   f"no server reachable among {','.join(self.servers)}")
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"no node {node_id!r} in the group")
        return await self._retrying({ResponseCode.NETWORK_ERROR})(find)

    async def _confirm_leader(self, node_id: str) -> tuple[str, int]:
        self._leader_address = None
        await self._discover_leader()
        if self._leader_id != node_id:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING,
                               f"leader is still {self._leader_id}, not {node_id}")
        answer = await self.metadata(self._leader_address or "")
        return node_id, answer.term if answer else 0

    def _check(self, header: pb.Header, address: str) -> None:
        failure = header_error(header, address)
        if failure is None:
            return
        if failure.code == ResponseCode.NOT_LEADER:
            if failure.leader_address and failure.leader_address != address:
                self._set_leader(failure.leader_address, failure.leader_id)
            else:
                self._forget_leader(address)
        elif failure.code in OUTCOME_UNKNOWN or failure.code == ResponseCode.DISK_FULL:
            self._forget_leader(address)
        raise failure

    def _set_leader(self, address: str, leader_id: str) -> None:
        self._learn([address])
        self._leader_address, self._leader_id = address, leader_id or None

    def _forget_leader(self, address: str) -> None:
        if self._leader_address == address:
            self._leader_address, self._leader_id = None, None

    def _learn(self, addresses: Iterable[str]) -> None:
        for address in addresses:
            if address and address not in self.servers:
                self.servers.append(address)

    # --------------------------------------------------------------- reading

    async def _next_batch(self, cursor: _ReadCursor, address: str | None) -> pb.ReadResponse | None:
        """The next batch of the stream (opening it when needed), or None at its end."""
        if cursor.end_index >= 0 and cursor.next_index > cursor.end_index:
            return None
        if cursor.call is None:
            if address is None and self._leader_address is None:
                await self._discover_leader()
            target = address or self._leader_address or ""
            request = pb.ReadRequest(header=self._header(), start_index=cursor.next_index,
                                     end_index=cursor.end_index, include_system=cursor.include_system,
                                     require_leader=address is None, raw=cursor.raw,
                                     max_batch_bytes=cursor.max_batch_bytes)
            cursor.call = (self._stub(target).Read(request, metadata=self._signed()), target)
        call, target = cursor.call
        try:
            response = await asyncio.wait_for(call.read(), self.call_timeout_s)
        except grpc.aio.AioRpcError as error:
            self._cancel(cursor)
            failure = rpc_error(error, target)
            if address is None:
                self._forget_leader(target)
            raise failure from None
        except asyncio.TimeoutError:
            self._cancel(cursor)
            raise DLedgerError(ResponseCode.TIMEOUT, f"{target} did not answer in time") from None
        if response is grpc.aio.EOF:
            cursor.call = None
            return None
        try:
            self._check(response.header, target)
        except DLedgerError:
            self._cancel(cursor)
            raise
        if cursor.end_index < 0:
            # Pin "-1 = committed" to the first answer, so that a resumed
            # stream ends where the original one would have.
            cursor.end_index = response.committed_index
        return response

    @staticmethod
    def _cancel(cursor: _ReadCursor) -> None:
        if cursor.call is not None:
            cursor.call[0].cancel()
            cursor.call = None

    # ------------------------------------------------------------- plumbing

    def _retrying(self, codes: frozenset[ResponseCode] | set[ResponseCode]) -> AsyncRetrying:
        backoff = wait_exponential_jitter(multiplier=0.02, max=0.2, jitter=0.02)

        def wait(state: RetryCallState) -> float:
            # A NOT_LEADER that names the leader: go there at once.
            failure = state.outcome.exception() if state.outcome else None
            if isinstance(failure, DLedgerError) and failure.code == ResponseCode.NOT_LEADER \
                    and failure.leader_address:
                return 0.0
            return backoff(state)

        def retryable(error: BaseException) -> bool:
            return isinstance(error, DLedgerError) and error.code in codes

        return AsyncRetrying(stop=stop_after_delay(self.deadline_s), wait=wait,
                             retry=retry_if_exception(retryable), reraise=True,
                             before_sleep=_log_retry)

    def _signed(self) -> tuple[tuple[str, str], ...] | None:
        """The request signature's headers when the client has credentials."""
        return self._signer.headers() if self._signer is not None else None

    def _header(self) -> pb.Header:
        return pb.Header(group=self.group)

    def _stub(self, address: str) -> Stub:
        stub = self._stubs.get(address)
        if stub is None:
            # Each call passes _signed() itself: no signing interceptor (it
            # would cost every call tens of microseconds).
            channel = self.security.channel(address, CHANNEL_OPTIONS, sign=False)
            self._channels[address] = channel
            stub = self._stubs[address] = Stub(channel)
            self._addresses[stub] = address
        return stub


def _log_retry(state: RetryCallState) -> None:
    failure = state.outcome.exception() if state.outcome else None
    log.debug("retry %d after %s", state.attempt_number, failure)


def _as_stream_response(answer: pb.AppendResponse, counts: list[int]) -> pb.AppendStreamResponse:
    """A unary Append's answer (a server without AppendStream) in the stream's
    shape: the callers' bodies were appended together, so each caller's
    indexes follow from the counts, and a refusal is every caller's."""
    response = pb.AppendStreamResponse(first_index=answer.first_index, last_index=answer.last_index,
                                       positions=answer.positions)
    response.header.CopyFrom(answer.header)
    first = answer.first_index
    for count in counts:
        if answer.header.code == ResponseCode.SUCCESS:
            response.outcomes.add(code=ResponseCode.SUCCESS, first_index=first, last_index=first + count - 1)
        else:
            response.outcomes.add(code=answer.header.code, message=answer.header.message)
        first += count
    return response
