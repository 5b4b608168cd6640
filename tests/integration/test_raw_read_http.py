"""Raw reads over a node's HTTP port (cluster/raw_read_http.py) against three
real node processes: the runs are the gRPC raw Read's, byte for byte, sent
from the files; the node counts them; a range above the committed index and
a wrong group end the stream with an error message, never with the end
frame; malformed requests get 400 and say what is wrong. (A node with TLS
refusing it: tests/spark/test_secure_live.py.)"""
from __future__ import annotations

import asyncio
import http.client
import socket
import struct
import time

import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import ResponseCode
from rpcgen import dledger_pb2 as pb
from tests.metrics_scrape import counter_total

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NODE_ARGS = ["--data-file-size", str(1 << 20), "--max-entry-size", str(64 << 10), "--index-file-size", str(64 << 10), "--preallocate", "false"]


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.new_event_loop().run_until_complete(coro)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("raw-http"), extra_args=NODE_ARGS, metrics=True)
    c.start()
    yield c
    c.stop_all()


async def fill(c: ProcessCluster) -> tuple[int, str]:
    """Entries across several 1 MiB segments, committed on every node; (last index, a follower)."""
    async with DLedgerClient(list(c.addresses.values())) as client:
        await find_leader(client, list(c.addresses.values()), timeout=30.0)
        last = 0
        for k in range(30):
            last = (await client.append([b"%d-%d-" % (k, i) + bytes(900) for i in range(100)])).last_index
        for _ in range(200):
            views = [await client.metadata(a) for a in c.addresses.values()]
            if all(v is not None and v.committed_index >= last for v in views):
                follower = next(v for v in views if v.role != "LEADER")
                return last, c.addresses[follower.self_id]
            await asyncio.sleep(0.05)
    raise AssertionError("the followers never committed the entries")


def http_runs(port: int, query: str) -> tuple[list[pb.ReadResponse], bool]:
    """The messages of a raw read, and whether the end frame closed them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /dledger/runs?{query} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        stream = sock.makefile("rb")
        assert stream.readline().startswith(b"HTTP/1.1 200 ")
        while stream.readline() not in (b"\r\n", b""):
            pass
        messages = []
        while len(prefix := stream.read(5)) == 5:
            flag, length = struct.unpack(">BI", prefix)
            assert flag == 0
            if length == 0:
                assert stream.read(1) == b""  # nothing after the end frame
                return messages, True
            messages.append(pb.ReadResponse.FromString(stream.read(length)))
        return messages, False


def metrics_port(c: ProcessCluster, address: str) -> int:
    node = next(n for n, a in c.addresses.items() if a == address)
    return c.metrics_ports[node]


def test_runs_over_http_are_the_grpc_raw_reads_bytes(cluster):
    last, follower = run(fill(cluster))
    port = metrics_port(cluster, follower)

    async def grpc_runs() -> tuple[bytes, bytes]:
        async with DLedgerClient(list(cluster.addresses.values())) as client:
            runs = [run async for run in client.read_raw(5, last - 3, from_address=follower, max_batch_bytes=64 << 10)]
        return b"".join(r for r, _ in runs), b"".join(d for _, d in runs)

    before = counter_total([port], "dledger_raw_http_read_bytes_total")
    messages, ended = http_runs(port, f"group=default&start=5&end={last - 3}&run_bytes={64 << 10}")
    assert ended and len(messages) > 5  # the range crosses several segments: several runs
    assert all(m.header.code == ResponseCode.SUCCESS and m.committed_index >= last for m in messages)
    assert all(len(m.raw_data) <= 64 << 10 for m in messages)
    records, data = run(grpc_runs())
    assert b"".join(m.raw_records for m in messages) == records
    assert b"".join(m.raw_data for m in messages) == data
    assert len(records) == (last - 3 - 5 + 1) * 32
    assert counter_total([port], "dledger_raw_http_read_bytes_total") - before == len(data)
    # The answer names the node, so a reader behind published ports can tell
    # when a port it was given leads to another node.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/dledger/runs?start=0&end=0")
    answer = conn.getresponse()
    node = next(n for n, a in cluster.addresses.items() if a == follower)
    assert answer.status == 200 and answer.getheader("X-DLedger-Node") == node
    answer.read()


def test_a_range_the_node_cannot_serve_ends_with_its_error(cluster):
    last, follower = run(fill(cluster))
    port = metrics_port(cluster, follower)
    messages, ended = http_runs(port, f"start=0&end={last + 10 ** 6}")
    assert not ended and len(messages) == 1
    assert messages[0].header.code == ResponseCode.INDEX_OUT_OF_RANGE
    assert "above the committed index" in messages[0].header.message
    messages, ended = http_runs(port, "group=another&start=0&end=3")
    assert not ended and [m.header.code for m in messages] == [ResponseCode.UNKNOWN_GROUP]


@pytest.mark.parametrize("query, why", [
    ("start=x&end=3", "parameter 'start' must be an integer"),
    ("start=1", "parameter 'end' is required"),
    ("start=5&end=2", "expected 0 <= start <= end"),
    ("start=0&end=2&run_bytes=0", "run_bytes must be positive"),
    ("start=0&end=2&strat=1", "unknown parameter 'strat'"),
])
def test_malformed_requests_are_refused_saying_why(cluster, query, why):
    conn = http.client.HTTPConnection("127.0.0.1", next(iter(cluster.metrics_ports.values())), timeout=10)
    conn.request("GET", "/dledger/runs?" + query)
    answer = conn.getresponse()
    assert answer.status == 400 and why in answer.read().decode()


def test_replays_yield_when_the_node_waits_for_a_core(tmp_path, monkeypatch):
    """While entries come in, a node whose loop thread counts as held up (the
    yield share set so low that any wait for a core counts) paces raw reads to
    its floor, over HTTP and over the gRPC Read alike, and says so in its
    metrics; once the writes stop, reads go unpaced again."""
    monkeypatch.setenv("DLEDGER_REPLAY_YIELD_WAIT_SHARE", "0.000001")
    monkeypatch.setenv("DLEDGER_REPLAY_YIELD_MIN_WAIT", "0")
    monkeypatch.setenv("DLEDGER_REPLAY_FLOOR_BYTES_PER_S", str(1 << 20))
    c = ProcessCluster(tmp_path, extra_args=NODE_ARGS, metrics=True)
    c.start()
    try:
        last, follower = run(fill(c))   # about 2.7 MB
        port = metrics_port(c, follower)
        query = f"start=0&end={last}&run_bytes={256 << 10}"

        async def reads_while(writing: bool) -> tuple[float, float]:
            async with DLedgerClient(list(c.addresses.values())) as client:
                async def write() -> None:
                    while True:
                        await client.append([b"w" * 100])
                        await asyncio.sleep(0.01)
                writer = asyncio.create_task(write()) if writing else None
                try:
                    started = time.monotonic()
                    messages, ended = await asyncio.to_thread(http_runs, port, query)
                    http_s = time.monotonic() - started
                    assert ended and sum(len(m.raw_data) for m in messages) > 2_500_000
                    started = time.monotonic()
                    read = sum([len(d) async for _, d in client.read_raw(0, last, from_address=follower,
                                                                         max_batch_bytes=256 << 10)])
                    assert read > 2_500_000
                    return http_s, time.monotonic() - started
                finally:
                    if writer is not None:
                        writer.cancel()

        http_s, grpc_s = run(reads_while(writing=True))
        # At 1 MiB/s each read takes 2 s or more; unpaced, well under 0.5 s.
        assert http_s > 1.2 and grpc_s > 1.2, (http_s, grpc_s)
        assert counter_total([port], "dledger_replay_pace_bytes_per_second") == 1 << 20
        http_s, grpc_s = run(reads_while(writing=False))
        assert http_s < 1.0 and grpc_s < 1.0, (http_s, grpc_s)
    finally:
        c.stop_all()
