"""The Python live reader's side of raw reads over a node's HTTP port
(cluster/raw_read_http.py; the JVM reader's is spark/jvm RawHttp.java).

`raw_http_runs` yields the (index records, entry bytes) of each run, as
DLedgerClient.read_raw does over gRPC: the same ReadResponse messages,
gRPC-framed, ended by an empty frame. A message carrying an error code
raises it as a DLedgerError, so the reader's failover treats both
transports alike; a connection cut before the end frame is a NETWORK_ERROR.
RawHttpUnavailable means the node does not serve runs here (TLS or auth on,
another node behind that port, nothing listening): read it over gRPC.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlencode

from dledger.errors import DLedgerError, ResponseCode
from dledger.raw_run import HTTP_FRAME, NODE_HEADER, RAW_READ_PATH
from rpcgen import dledger_pb2 as pb

_NODE_HEADER = NODE_HEADER.lower().encode()
CONNECT_TIMEOUT_S = 1.0
MAX_MESSAGE = 256 << 20


class RawHttpUnavailable(Exception):
    """The node does not serve raw reads at this address: use gRPC."""


def http_address(grpc_address: str, metrics_address: str) -> str | None:
    """The host the reader already reaches, with the port the node's Metadata
    names (a node may report the address it binds, 0.0.0.0 say)."""
    host, _, _ = grpc_address.rpartition(":")
    _, _, port = metrics_address.rpartition(":")
    return f"{host}:{port}" if host and port.isdigit() else None


async def raw_http_runs(address: str, node_id: str, group: str, start: int, end: int, run_bytes: int,
                        timeout_s: float) -> AsyncIterator[tuple[bytes, bytes]]:
    """Opens the read at once (raising RawHttpUnavailable), then yields runs."""
    reader, writer = await _open(address, node_id, group, start, end, run_bytes, timeout_s)
    return _runs(address, reader, writer, timeout_s)


async def _open(address: str, node_id: str, group: str, start: int, end: int, run_bytes: int,
                timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                                CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError, ValueError) as error:
        raise RawHttpUnavailable(f"{address} cannot be reached ({error!r})") from None
    try:
        query = urlencode({"group": group, "start": start, "end": end, "run_bytes": run_bytes})
        writer.write(f"GET {RAW_READ_PATH}?{query} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), timeout_s)
        answering = b""
        while (line := await asyncio.wait_for(reader.readline(), timeout_s)) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == _NODE_HEADER:
                answering = value.strip()
        if not status.startswith((b"HTTP/1.1 200 ", b"HTTP/1.0 200 ")):
            raise RawHttpUnavailable(f"{address} answered {status.decode(errors='replace').strip()}")
        if answering.decode(errors="replace") != node_id:
            # Behind published ports the port a node names may be another node's.
            raise RawHttpUnavailable(f"{address} is node {answering.decode(errors='replace')!r}, not {node_id!r}")
        return reader, writer
    except RawHttpUnavailable:
        writer.close()
        raise
    except (OSError, asyncio.TimeoutError) as error:
        writer.close()
        raise RawHttpUnavailable(f"{address}: {error!r}") from None


async def _runs(address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                timeout_s: float) -> AsyncIterator[tuple[bytes, bytes]]:
    try:
        while True:
            try:
                flag, length = HTTP_FRAME.unpack(await asyncio.wait_for(reader.readexactly(HTTP_FRAME.size), timeout_s))
                if flag != 0 or length > MAX_MESSAGE:
                    raise DLedgerError(ResponseCode.INTERNAL_ERROR, f"{address}: a raw read sent a frame of flag "
                                                                    f"{flag} and length {length}")
                if length == 0:
                    return
                message = pb.ReadResponse.FromString(await asyncio.wait_for(reader.readexactly(length), timeout_s))
            except asyncio.IncompleteReadError:
                raise DLedgerError(ResponseCode.NETWORK_ERROR, f"{address}: the raw read was cut before its end") \
                    from None
            except (OSError, asyncio.TimeoutError) as error:
                raise DLedgerError(ResponseCode.NETWORK_ERROR, f"{address}: {error!r}") from None
            header = message.header
            if header.code != ResponseCode.SUCCESS:
                raise DLedgerError(ResponseCode.of(header.code), f"{address}: {header.message}",
                                   leader_id=header.leader_id, leader_address=header.leader_address)
            yield message.raw_records, message.raw_data
    finally:
        writer.close()
