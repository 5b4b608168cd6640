"""Live mode: a running group's committed log through the client library.

The driver asks the leader for its begin and committed index (Metadata); an
executor streams one fixed index range with the committed range-read RPC
(DLedgerClient.read), which follows the leader across a failover and resumes
after the last entry it delivered. Only entries at or below the committed
index exist for that RPC, so nothing uncommitted can be read.
"""
from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from spark.entry_scan import scanned_magic
from spark.partitions import LiveRange

# Entries handed from the event loop to the (synchronous) Spark reader at a time.
CHUNK_ENTRIES = 4096
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
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="dledger-live", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


def committed_bounds(servers: tuple[str, ...], group: str) -> tuple[int, int]:
    """(begin index, committed index) as the group's leader knows them."""
    async def ask(client: DLedgerClient) -> tuple[int, int]:
        _, address = await client.leader()
        metadata = await client.metadata(address)
        if metadata is None:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"leader {address} did not answer Metadata")
        return metadata.ledger_begin_index, metadata.committed_index
    return _with_client(servers, group, ask)


def _with_client(servers: tuple[str, ...], group: str, work: Callable[[DLedgerClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with DLedgerClient(servers, group) as client:
            return await work(client)
    return _LoopThread.run(run())


def live_entries(part: LiveRange) -> Iterator[tuple[int, int, int, int, memoryview]]:
    """(index, term, pos, magic, body) of the NORMAL entries of the range, in
    order, as the file scan hands them on (see entry_scan.scanned_magic).
    The process's event loop is asked for a chunk at a time, so the Spark
    reader stays a plain generator and memory stays bounded."""
    client = DLedgerClient(part.servers, part.group)
    stream = client.read(part.first_index, part.last_index).__aiter__()

    async def take() -> list[tuple[int, int, int, int, memoryview]]:
        chunk: list[tuple[int, int, int, int, memoryview]] = []
        while len(chunk) < CHUNK_ENTRIES:
            try:
                entry = await stream.__anext__()
            except StopAsyncIteration:
                break
            if zlib.crc32(entry.body) != entry.body_crc:
                raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"entry {entry.index}: body CRC mismatch on the wire")
            chunk.append((entry.index, entry.term, entry.pos, scanned_magic(entry.magic, entry.channel),
                          memoryview(entry.body)))
        return chunk

    async def close() -> None:
        await stream.aclose()  # type: ignore[attr-defined]
        await client.close()

    try:
        while True:
            chunk = _LoopThread.run(take())
            yield from chunk
            if len(chunk) < CHUNK_ENTRIES:
                return
    finally:
        _LoopThread.run(close())

