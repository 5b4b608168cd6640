"""The log client's AppendStream: concurrent single appends coalesced into
shared messages on one stream, each caller answered with its own indexes or
its own error. Three real servers on real gRPC ports (grpc_harness)."""
from __future__ import annotations

import asyncio

import pytest

from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from tests.unit.grpc_harness import leader_of, start_cluster, stop_cluster, wait_for

pytestmark = pytest.mark.timeout(60)


async def test_concurrent_single_appends_share_a_few_messages_and_each_gets_its_own_index(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        async with DLedgerClient([node.address for node in nodes.values()]) as client:
            await client.leader()
            bodies = [f"caller {i}".encode() for i in range(128)]
            results = await asyncio.gather(*(client.append([body]) for body in bodies))
            (stream,) = client._append_streams.values()
            messages = stream._next_id - 1
            assert messages <= 8, f"{messages} messages for 128 callers"
            assert sorted(r.first_index for r in results) == \
                list(range(min(r.first_index for r in results), min(r.first_index for r in results) + 128))
            for body, result in zip(bodies, results):
                assert result.first_index == result.last_index and len(result.positions) == 1
                assert (await client.get(result.first_index)).body == body
    finally:
        await stop_cluster(nodes)


async def test_one_callers_oversized_body_fails_that_caller_only(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        limit = next(iter(nodes.values())).server.config.max_entry_size
        async with DLedgerClient([node.address for node in nodes.values()]) as client:
            await client.leader()
            bodies = [[b"a"], [b"b1", b"b2"], [b"x" * (limit + 1)], [b"d"]]
            outcomes = await asyncio.gather(*(client.append(b) for b in bodies), return_exceptions=True)
            (stream,) = client._append_streams.values()
            assert stream._next_id - 1 == 1           # all four shared one message
            assert isinstance(outcomes[2], DLedgerError) and outcomes[2].code is ResponseCode.ENTRY_TOO_LARGE
            a, b, d = outcomes[0], outcomes[1], outcomes[3]
            assert (b.first_index, b.last_index) == (a.last_index + 1, a.last_index + 2)
            assert d.first_index == b.last_index + 1
            for result, expected in ((a, [b"a"]), (b, [b"b1", b"b2"]), (d, [b"d"])):
                got = [(await client.get(i)).body for i in range(result.first_index, result.last_index + 1)]
                assert got == expected
    finally:
        await stop_cluster(nodes)


async def test_without_coalescing_each_call_is_its_own_message(tmp_path):
    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        async with DLedgerClient([node.address for node in nodes.values()], coalesce=False) as client:
            await client.leader()
            results = await asyncio.gather(*(client.append([b"%d" % i, b"more"]) for i in range(8)))
            (stream,) = client._append_streams.values()
            assert stream._next_id - 1 == 8
            assert len({r.first_index for r in results}) == 8
            assert all(r.last_index == r.first_index + 1 and len(r.positions) == 2 for r in results)
    finally:
        await stop_cluster(nodes)


async def test_a_server_of_an_earlier_version_without_append_stream_gets_unary_appends(tmp_path):
    """A rolling upgrade: the client meets a leader that answers AppendStream
    with UNIMPLEMENTED, and appends by unary calls instead, each caller still
    with its own indexes."""
    import grpc

    from dledger.rpc.service import DLedgerServicer

    class EarlierVersion(DLedgerServicer):
        async def AppendStream(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    nodes = await start_cluster(tmp_path)
    try:
        await wait_for(lambda: leader_of(nodes) is not None)
        for node in nodes.values():
            await node.unserve()
            await node.serve(EarlierVersion)
        async with DLedgerClient([node.address for node in nodes.values()]) as client:
            await client.leader()
            bodies = [f"caller {i}".encode() for i in range(20)]
            results = await asyncio.gather(*(client.append([body]) for body in bodies))
            assert client._unary_append_stubs
            for body, result in zip(bodies, results):
                assert result.first_index == result.last_index
                assert (await client.get(result.first_index)).body == body
    finally:
        await stop_cluster(nodes)
