"""Committed-range raw reads over plain HTTP, sent from the files (sendfile).

The Spark JVM reader replays a running group by reading runs of entries as
stored (a Read with `raw`). Over gRPC each 1 MiB run is read into the node's
memory, copied into HTTP/2 frames and copied out of them again by the
reader: about 0.85 ms of the node's CPU and 0.6-1 ms of the reader's per MiB
(docs/spark.md). Kafka serves its consumers with sendfile for the same
reason. This endpoint, on the node's metrics port, answers the same range
with the same messages, but the entries' bytes go from the segment file to
the socket inside the kernel, from a thread of the HTTP server, so the
event loop only plans where the runs lie.

    GET /dledger/runs?group=G&start=S&end=E&run_bytes=B

answers 200 and a stream of gRPC-framed ReadResponse messages (a flag byte
0, a 4-byte big-endian length, the message): each a run with its index
records and data, exactly the bytes a raw Read answers; an error met (a
range above the committed index, a damaged entry) is one message whose
header carries its code, after which the connection closes; the end of the
range is an empty frame. A connection that closes without it was cut (the
node died): the reader resumes after the last whole run from another node.
Every entry is checked by the reader (header, index, CRCs), as a gRPC run is.

Plain HTTP has no TLS and no signature: on a node with TLS or authentication
the endpoint answers 403 and readers use the gRPC Read.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from http import HTTPStatus
from typing import BinaryIO, Callable, Protocol
from urllib.parse import parse_qs

from dledger.errors import DLedgerError, ResponseCode
from dledger.raw_run import END_FRAME, HTTP_FRAME, NODE_HEADER, raw_run_prefix
from dledger.rpc.edge import fill_header
from dledger.server import DLedgerServer
from dledger.store.file_store import RawRunPlan
from rpcgen import dledger_pb2 as pb

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-dledger-runs"
DEFAULT_RUN_BYTES = 1 << 20
PLAN_BYTES = 8 << 20          # what one hop into the event loop plans
PLAN_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0         # a reader that stops reading for this long is dropped


class Handler(Protocol):
    """What of http.server's BaseHTTPRequestHandler the endpoint uses."""
    connection: socket.socket
    close_connection: bool
    wfile: BinaryIO

    def send_response(self, code: int, message: str | None = None) -> None: ...
    def send_header(self, keyword: str, value: str) -> None: ...
    def end_headers(self) -> None: ...


@dataclass
class _Planned:
    runs: list[RawRunPlan]
    head: bytes          # a ReadResponse's small fields: SUCCESS, the committed index
    error: bytes = b""   # or a ReadResponse carrying an error code


class RawReadEndpoint:
    """Serves raw reads (dledger/raw_run.py's RAW_READ_PATH) for one node. `enabled` is False on a node with TLS
    or authentication: the bytes would travel in clear and unsigned."""

    def __init__(self, server: DLedgerServer, loop: asyncio.AbstractEventLoop, enabled: bool,
                 on_run_sent: Callable[[int], None] = lambda length: None) -> None:
        self.server = server
        self.loop = loop
        self.enabled = enabled
        self.on_run_sent = on_run_sent  # the run's entry bytes (a metric)

    def serve(self, handler: Handler, query: str) -> None:
        if not self.enabled:
            _answer_text(handler, HTTPStatus.FORBIDDEN, "raw reads over HTTP are off on a node with TLS or "
                         "authentication: read with the gRPC Read (raw=true) on the client port")
            return
        try:
            group, start, end, run_bytes = _parse(query)
        except ValueError as error:
            _answer_text(handler, HTTPStatus.BAD_REQUEST, str(error))
            return
        handler.close_connection = True  # the body's end is the end frame, then the connection's
        handler.send_response(HTTPStatus.OK)
        handler.send_header("Content-Type", CONTENT_TYPE)
        handler.send_header("Cache-Control", "no-store")
        # Which node answers: behind published ports (Docker) the port a
        # node's Metadata names may lead a reader to another node's.
        handler.send_header(NODE_HEADER, self.server.config.self_id)
        handler.send_header("Connection", "close")
        handler.end_headers()
        sock = handler.connection
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            self._stream(sock, group, start, end, run_bytes)
        except (OSError, TimeoutError, RuntimeError, CancelledError) as error:
            # The reader went away or stopped reading, or the node is stopping
            # (its loop no longer plans): the reader reads the rest elsewhere.
            log.debug("raw read of %d..%d ended early: %s", start, end, error)

    def _stream(self, sock: socket.socket, group: str, start: int, end: int, run_bytes: int) -> None:
        files: dict[str, BinaryIO] = {}
        try:
            index = start
            while index <= end:
                planned = asyncio.run_coroutine_threadsafe(self._plan(group, index, end, run_bytes),
                                                           self.loop).result(PLAN_TIMEOUT_S)
                if planned.error:
                    sock.sendall(_frame(planned.error))
                    return
                for run in planned.runs:
                    wait = self.server.read_pacer.delay(run.length)
                    if wait:
                        time.sleep(wait)   # the node's loop runs late: the replay yields (ReadPacer)
                    prefix = raw_run_prefix(planned.head, run.records, run.length)
                    sock.sendall(HTTP_FRAME.pack(0, len(prefix) + run.length) + prefix)
                    _send_file(sock, files, run)
                    self.on_run_sent(run.length)
                    index += run.count
            sock.sendall(END_FRAME)
        finally:
            for file in files.values():
                file.close()

    async def _plan(self, group: str, start: int, end: int, run_bytes: int) -> _Planned:
        """On the event loop: the next runs, or the error to answer."""
        ms = self.server.member_state
        try:
            runs = self.server.plan_raw_reads(group, start, end, run_bytes, PLAN_BYTES)
            if not runs:  # not expected under the bounds' checks; never end the stream short
                raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                                   f"entry {start} is past this node's log end {self.server.store.ledger_end_index}")
        except DLedgerError as e:
            error = fill_header(pb.ReadResponse(), ms, "", e.code, e.message, e.leader_id, e.leader_address)
            return _Planned([], b"", error.SerializeToString())
        head = fill_header(pb.ReadResponse(committed_index=ms.committed_index), ms, "", 200, "")
        return _Planned(runs, head.SerializeToString())


def _parse(query: str) -> tuple[str, int, int, int]:
    values = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(values) - {"group", "start", "end", "run_bytes"})
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} (expected group, start, end, run_bytes)")
    numbers = []
    for name, default in (("start", None), ("end", None), ("run_bytes", DEFAULT_RUN_BYTES)):
        text = values.get(name)
        if text is None:
            if default is None:
                raise ValueError(f"parameter {name!r} is required")
            numbers.append(default)
            continue
        try:
            numbers.append(int(text))
        except ValueError:
            raise ValueError(f"parameter {name!r} must be an integer, got {text!r}") from None
    start, end, run_bytes = numbers
    if start < 0 or end < start:
        raise ValueError(f"expected 0 <= start <= end, got start={start} end={end}")
    if run_bytes <= 0:
        raise ValueError(f"run_bytes must be positive, got {run_bytes}")
    return values.get("group", ""), start, end, run_bytes


def _frame(message: bytes) -> bytes:
    return HTTP_FRAME.pack(0, len(message)) + message


def _send_file(sock: socket.socket, files: dict[str, BinaryIO], run: RawRunPlan) -> None:
    """The run's bytes from its segment file (opened here, by name: the event
    loop may close its own descriptor when retention deletes the segment, and
    a file opened before then still reads)."""
    path = run.segment.path
    file = files.get(path)
    if file is None:
        file = files[path] = open(path, "rb", buffering=0)
    sent = sock.sendfile(file, run.offset, run.length)
    if sent != run.length:  # the file is shorter than its index says: the reader fails over
        raise OSError(f"sent {sent} of {run.length} bytes of {path}")


def _answer_text(handler: Handler, status: HTTPStatus, text: str) -> None:
    body = (text + "\n").encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
