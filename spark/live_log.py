"""Live mode: a running group's committed log through the client library.

Planning (the driver) asks the group for its begin and committed index. It
probes every node it can reach, not just the one a follower names as leader:
during an election that leader may be dead, and any node's committed index
is a valid bound (everything at or below it is committed and never changes;
a follower's is at most a heartbeat behind the leader's). So planning rides
out an election, retrying within PLANNING_TIMEOUT_S until some node answers.

Reading (the executors) streams one fixed index range with the committed
range-read RPC. The Arrow path asks for the range as stored (`raw`): each
message a run of entries' bytes with their index records, which the
vectorised decoder checks (every body and chain CRC) and decodes as it does
a segment's bytes in file mode, so neither the node nor the reader spends
Python work per entry; a run that fails a check is read again entry by
entry, which the node CRC-checks itself (a damaged copy is refused, and the
node repairs it, and the read moves on to another node). The tuples path
reads decoded entries, many per message. With preferReplicas (the default)
a partition reads from a follower, chosen round-robin by partition, so a
replay does not take the leader's CPU from writers: a node serves only what
it has committed itself, so a follower behind the pinned end refuses
(INDEX_OUT_OF_RANGE); the range is then asked of it again for up to
REPLICA_WAIT_S and then handed to the next node, the leader last. A read cut
off midway resumes after the last entry delivered, on the next node.
maxBytesPerSecond throttles a partition's reads.

On a secured cluster every client here signs and trusts the CA as the
source's user, secretFile and tlsCa options say (or DLEDGER_USER,
DLEDGER_SECRET_FILE, DLEDGER_TLS_CA); a refusal stops planning at once with
a message saying which options to give, rather than waiting out the
planning timeout.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa

from dledger.client import DLedgerClient
from dledger.entry import INDEX_RECORD, INDEX_RECORD_SIZE, run_indexes
from dledger.errors import DLedgerError, ResponseCode
from rpcgen import dledger_pb2 as pb
from spark.entry_scan import scanned_magic
from spark.options import LiveAccess
from spark.partitions import LiveRange
from spark.raw_http import RawHttpUnavailable, http_address, raw_http_runs
from spark.row_builder import scanned_record_batches
from spark.vector_decode import CHUNK_BYTES, ChunkError, output_schema, raw_run_batch

# Entries handed from the event loop to the (synchronous) Spark reader at a time.
CHUNK_ENTRIES = 4096
# Bytes of a raw run a node answers in one message (the Arrow path: a node
# reads a run on its event loop, so runs stay small), and bytes handed to the
# decoder at a time (runs that continue one another joined).
RAW_RUN_BYTES = 1 << 20
RAW_CHUNK_BYTES = CHUNK_BYTES
# How long planning keeps trying to reach some node of the group.
PLANNING_TIMEOUT_S = 30.0
# How long a replica behind the pinned committed index is waited for.
REPLICA_WAIT_S = 2.0
# A replica read gives up on an unreachable node after this long (the leader
# read then follows the group as DLedgerClient does, for its own deadline).
REPLICA_DEADLINE_S = 2.0
T = TypeVar("T")


class _LoopThread:
    """One event loop per process, on a daemon thread. gRPC's asyncio support
    binds itself to the first loop that uses it, so a Python worker that
    reads many partitions (or a stream that asks for the committed index at
    every trigger) must not create and close a loop each time."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coroutine: Coroutine[Any, Any, T]) -> T:
        return cls.submit(coroutine).result()

    @classmethod
    def submit(cls, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the loop; its result comes later."""
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="dledger-live", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop)


@dataclass(frozen=True)
class GroupView:
    """What planning learnt: bounds, and the nodes to read from."""
    begin_index: int
    committed_index: int
    leader: str | None         # its address, when a node answered as leader
    followers: tuple[str, ...]  # addresses of the other nodes that answered


REFUSED = (ResponseCode.UNAUTHENTICATED, ResponseCode.FORBIDDEN)


def refused(error: DLedgerError) -> DLedgerError:
    """A node's refusal of the caller, with what to do about it."""
    return DLedgerError(error.code, f"{error.message}. The cluster requires credentials the dledger source did not "
                                    f"give or that it refuses: set the options user and secretFile (and tlsCa for "
                                    f"TLS), or DLEDGER_USER, DLEDGER_SECRET_FILE and DLEDGER_TLS_CA before the "
                                    f"Spark session starts; the user needs Sub on the Cluster")


def committed_bounds(servers: tuple[str, ...], group: str, timeout_s: float = PLANNING_TIMEOUT_S,
                     access: LiveAccess = LiveAccess()) -> tuple[int, int]:
    """(begin index, committed index) of the group, within `timeout_s` whatever elections happen."""
    view = group_view(servers, group, timeout_s, access)
    return view.begin_index, view.committed_index


def group_view(servers: tuple[str, ...], group: str, timeout_s: float = PLANNING_TIMEOUT_S,
               access: LiveAccess = LiveAccess()) -> GroupView:
    async def ask(client: DLedgerClient) -> GroupView:
        deadline = time.monotonic() + timeout_s
        while True:
            view = await _probe(client)
            if view is not None:
                return view
            if time.monotonic() >= deadline:
                tls = "" if access.security().ca else "; a cluster with TLS needs the tlsCa option"
                raise DLedgerError(ResponseCode.NETWORK_ERROR,
                                   f"no node of group {group!r} answered Metadata within {timeout_s:.0f}s "
                                   f"(servers {','.join(servers)}{tls})")
            await asyncio.sleep(0.2)
    return _with_client(servers, group, ask, access)


async def _probe(client: DLedgerClient) -> GroupView | None:
    """Every node reachable from the given servers and the peers they name."""
    answers: dict[str, pb.MetadataResponse | None] = {}
    pending = list(client.servers)
    while pending:
        replies = await asyncio.gather(*(_metadata(client, a) for a in pending))
        answers.update(zip(pending, replies))
        named = {peer.address for reply in replies if reply is not None for peer in reply.peers}
        pending = [a for a in named if a and a not in answers]
    usable = {address: a for address, a in answers.items() if a is not None and not a.repairing}
    if not usable:
        return None
    leaders = sorted((a.term, address) for address, a in usable.items() if a.role == "LEADER")
    leader = leaders[-1][1] if leaders else None
    if leader is not None:
        begin, committed = usable[leader].ledger_begin_index, usable[leader].committed_index
    else:  # an election: the followers' view, a heartbeat old at most
        begin = max(a.ledger_begin_index for a in usable.values())
        committed = max(a.committed_index for a in usable.values())
    seen_ids = {usable[leader].self_id} if leader else set()
    followers = []
    for address, answer in sorted(usable.items()):
        if address != leader and answer.self_id not in seen_ids:  # one node may be named twice
            seen_ids.add(answer.self_id)
            followers.append(address)
    return GroupView(begin, committed, leader, tuple(followers))


async def _metadata(client: DLedgerClient, address: str) -> pb.MetadataResponse | None:
    try:
        return await client.metadata(address)
    except DLedgerError as error:
        if error.code in REFUSED:
            raise refused(error) from None
        return None  # another group, or a node that cannot answer: not one to plan with


def _with_client(servers: tuple[str, ...], group: str, work: Callable[[DLedgerClient], Awaitable[T]],
                 access: LiveAccess = LiveAccess()) -> T:
    async def run() -> T:
        async with DLedgerClient(servers, group, security=access.security()) as client:
            return await work(client)
    return _LoopThread.run(run())


Scanned = tuple[int, int, int, int, memoryview]


def live_batches(part: LiveRange, topics: frozenset[str] | None = None,
                 columns: Iterable[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of the range as Arrow batches, a run of entries at a time
    from raw reads (see the module docstring)."""
    schema = output_schema(columns)
    reader = _RangeReader(part, raw=True)
    tag_codes: dict[str, int] = {}
    chain: int | None = None
    expected = part.first_index
    # The next chunk is fetched (on the loop's thread, mostly waiting on
    # the node) while this one is decoded: without it a third of a read's
    # time was spent waiting.
    fetching = _LoopThread.submit(reader.take_runs(RAW_CHUNK_BYTES))
    try:
        while True:
            runs = fetching.result()
            if runs:
                fetching = _LoopThread.submit(reader.take_runs(RAW_CHUNK_BYTES))
            for records, data in runs:
                first, last = run_indexes(records)
                if first != expected:
                    chain = None   # entries left out before this run: its first link is not checked
                expected = last + 1
                try:
                    batch, chain = raw_run_batch(records, data, chain, topics, schema, tag_codes)
                except ChunkError:
                    batch, chain = _reference_run(part, records, topics, schema), None
                if batch is not None and batch.num_rows:
                    yield batch
            if not runs:
                return
    finally:
        fetching.cancel()
        concurrent.futures.wait([fetching])
        _LoopThread.run(reader.close())


def _reference_run(part: LiveRange, records: bytes, topics: frozenset[str] | None,
                   schema: pa.Schema) -> pa.RecordBatch | None:
    """A run that failed a check, read again entry by entry (each entry
    CRC-checked by the node that serves it) and decoded by the reference."""
    first, last = run_indexes(records)
    run = replace(part, first_index=first, last_index=last)
    batches = [b.select(schema.names) for b in scanned_record_batches(live_entries(run), topics)]
    return pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0] if batches else None


def live_entries(part: LiveRange) -> Iterator[Scanned]:
    """(index, term, pos, magic, body) of the NORMAL entries of the range, in
    order, as the file scan hands them on (see entry_scan.scanned_magic).
    The process's event loop is asked for a chunk at a time, so the Spark
    reader stays a plain generator and memory stays bounded."""
    reader = _RangeReader(part)
    try:
        while True:
            chunk = _LoopThread.run(reader.take(CHUNK_ENTRIES))
            yield from chunk
            if len(chunk) < CHUNK_ENTRIES:
                return
    finally:
        _LoopThread.run(reader.close())


def _continues(before: tuple[bytes, bytes], run: tuple[bytes, bytes]) -> bool:
    """Whether `run` starts with the entry after `before`'s last, at the byte after it."""
    _, pos, size, index, _ = INDEX_RECORD.unpack_from(before[0], len(before[0]) - INDEX_RECORD_SIZE)
    _, next_pos, _, next_index, _ = INDEX_RECORD.unpack_from(run[0], 0)
    return next_index == index + 1 and next_pos == pos + size


class _RangeReader:
    """Entries first..last of a partition: from its replicas in order, then
    the leader, resuming after the last entry delivered whenever a node fails."""

    def __init__(self, part: LiveRange, raw: bool = False) -> None:
        self.part = part
        self.raw = raw
        self.next_index = part.first_index
        self.sources: list[str | None] = [*part.replicas, None]  # None: the leader, wherever it is
        self.stream: AsyncIterator[Any] | None = None
        self.client: DLedgerClient | None = None
        self.started = self.begun = time.monotonic()
        self.bytes = 0
        self.node_failures: list[str] = []
        # A replica's HTTP address (spark/raw_http.py) and id; None: read it over gRPC.
        self.http_of: dict[str, tuple[str, str] | None] = {}

    async def take(self, count: int) -> list[Scanned]:
        chunk: list[Scanned] = []
        while len(chunk) < count and self.next_index <= self.part.last_index:
            entry = await self._next()
            if entry is None:
                break
            if zlib.crc32(entry.body) != entry.body_crc:
                raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"entry {entry.index}: body CRC mismatch on the wire")
            chunk.append((entry.index, entry.term, entry.pos, scanned_magic(entry.magic, entry.channel),
                          memoryview(entry.body)))
            self.bytes += len(entry.body)
        await self._throttle()
        return chunk

    async def take_runs(self, max_bytes: int) -> list[tuple[bytes, bytes]]:
        """Raw runs (index records, entry bytes) of about max_bytes in all; [] past the end.
        Runs that continue one another (the next entry, at the next byte: the
        same data segment) are joined, so that the decoder takes large chunks
        while a node reads and sends a small run at a time."""
        pieces: list[list[tuple[bytes, bytes]]] = []
        taken = 0
        while taken < max_bytes and self.next_index <= self.part.last_index:
            run = await self._next()
            if run is None:
                break
            if pieces and _continues(pieces[-1][-1], run):
                pieces[-1].append(run)
            else:
                pieces.append([run])
            taken += len(run[1])
        self.bytes += taken
        await self._throttle()
        return [(b"".join(r for r, _ in joined), b"".join(d for _, d in joined)) if len(joined) > 1 else joined[0]
                for joined in pieces]

    def _fresh(self, item: Any) -> Any:
        """A streamed entry or run, moving next_index past it (None: an entry
        delivered before a resume)."""
        if not self.raw:
            if item.index < self.next_index:
                return None
            self.next_index = item.index + 1
            return item
        # A raw stream always starts at next_index (a resumed one too), and
        # may skip entries the caller may not read (users' secrets), as the
        # decoded read leaves them out; a run before it or past the range's
        # end is the node's mistake.
        first, last = run_indexes(item[0])
        if first < self.next_index or last > self.part.last_index:
            raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"a raw read answered entries {first}..{last} "
                                                            f"when {self.next_index}..{self.part.last_index} "
                                                            f"were asked for")
        self.next_index = last + 1
        return item

    async def _next(self) -> Any:
        """The next entry (or raw run) of the range (None past its end), from
        whichever node can serve it."""
        while True:
            if self.stream is None:
                await self._open()
            assert self.stream is not None
            try:
                entry = await self.stream.__anext__()
            except StopAsyncIteration:
                # The node served the whole range: it refuses a range above
                # its committed index up front, and a read ends only at the
                # range's end (the log's own entries, such as a term's NOOP,
                # are left out, so the last entry delivered may be earlier).
                await self._drop()
                self.next_index = self.part.last_index + 1
                return None
            except DLedgerError as error:
                await self._drop()
                if error.code in REFUSED:
                    raise refused(error) from None
                if self.sources[0] is None:
                    raise  # the leader read followed the group for its whole deadline
                await self._on_replica_error(error)
                continue
            fresh = self._fresh(entry)
            if fresh is not None:  # else: already delivered before a resume
                return fresh

    async def _open(self) -> None:
        source = self.sources[0]
        deadline = REPLICA_DEADLINE_S if source is not None else 10.0
        security = self.part.access.security()
        self.client = DLedgerClient(self.part.servers if source is None else [source], self.part.group,
                                    deadline_s=deadline, security=security)
        if self.raw and source is not None and self.part.raw_http and not security.ca and not security.user:
            # Plain HTTP has neither TLS nor signatures: only where neither is configured.
            http = await self._http_address(source)
            if http is not None:
                try:
                    self.stream = (await raw_http_runs(http[0], http[1], self.part.group, self.next_index,
                                                       self.part.last_index, RAW_RUN_BYTES, deadline)).__aiter__()
                    return
                except RawHttpUnavailable:
                    self.http_of[source] = None  # read this node over gRPC from now on
        if self.raw:
            self.stream = self.client.read_raw(self.next_index, self.part.last_index, from_address=source,
                                               max_batch_bytes=RAW_RUN_BYTES).__aiter__()
        else:
            self.stream = self.client.read(self.next_index, self.part.last_index,
                                           from_address=source).__aiter__()

    async def _http_address(self, source: str) -> tuple[str, str] | None:
        """Where `source` serves runs over HTTP, and its id; None: not offered or not known now."""
        if source not in self.http_of:
            assert self.client is not None
            meta = await self.client.metadata(source)
            if meta is None:
                return None  # not answering now: gRPC finds out and fails over
            address = http_address(source, meta.metrics_address) if meta.metrics_address else None
            self.http_of[source] = (address, meta.self_id) if address else None
        return self.http_of[source]

    async def _on_replica_error(self, error: DLedgerError) -> None:
        if error.code == ResponseCode.INDEX_OUT_OF_RANGE and \
                time.monotonic() - self.started < REPLICA_WAIT_S:
            await asyncio.sleep(0.1)  # behind the pinned index: it may catch up in a moment
            return
        await self._fail_over(f"{error.code.name}: {error.message}")

    async def _fail_over(self, why: str) -> None:
        failed = self.sources.pop(0)
        self.node_failures.append(f"{failed or 'leader'}: {why}")
        self.started = time.monotonic()
        if not self.sources:
            raise DLedgerError(ResponseCode.NETWORK_ERROR,
                               f"entries {self.next_index}..{self.part.last_index}: no node served them "
                               f"({'; '.join(self.node_failures)})")

    async def _throttle(self) -> None:
        limit = self.part.max_bytes_per_second
        if limit:
            ahead = self.bytes / limit - (time.monotonic() - self.begun)
            if ahead > 0:
                await asyncio.sleep(ahead)

    async def _drop(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()  # type: ignore[attr-defined]
            self.stream = None
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def close(self) -> None:
        await self._drop()
