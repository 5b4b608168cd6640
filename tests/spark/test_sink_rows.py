"""The sink's row encoder, without Spark or a cluster: a row encoded from its
columns (the template path for body, topic and tags; to_protocol for the
rest) is the message the producer's to_protocol makes of the same row, with
the row's derived id; chunks keep every row's position in the partition;
what the sink refuses before sending is named with its position."""
from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from broker.client.errors import BadRequestError, PayloadTooLargeError
from broker.client.message import Message, to_protocol
from spark.sink_rows import BadRowError, RowEncoder, chunks_of_batches, chunks_of_rows, id_prefix, message_id

PREFIX = id_prefix("write-1", 3)
NOW = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.timezone.utc)


def encoder(topic: str | None = "Orders", max_body: int = 1024) -> RowEncoder:
    return RowEncoder(topic, PREFIX, max_body, namespace="ns")


def expected(position: int, **fields) -> bytes:  # noqa: ANN003
    wire = to_protocol(Message(**fields), message_id("write-1", 3, position), "ns", now=0.0)
    wire.system_properties.ClearField("born_timestamp")
    return wire.SerializeToString(deterministic=True)


def got(wire) -> bytes:  # noqa: ANN001
    copy = type(wire)()
    copy.CopyFrom(wire)
    copy.system_properties.ClearField("born_timestamp")
    return copy.SerializeToString(deterministic=True)


def test_rows_of_the_template_shape_encode_as_to_protocol_does():
    rows = [{"body": b"a"}, {"body": "b\u00e9", "tags": "t1"}, {"body": b"c", "topic": "Payments"},
            {"body": bytearray(b"d"), "topic": None, "tags": None}]
    (chunk,) = chunks_of_rows(rows, 10)
    encoded, refused = encoder().encode(chunk)
    assert refused == []
    assert [(r.position, r.topic) for r in encoded] == [(0, "Orders"), (1, "Orders"), (2, "Payments"), (3, "Orders")]
    assert [got(r.wire) for r in encoded] == [
        expected(0, topic="Orders", body=b"a"), expected(1, topic="Orders", body="b\u00e9".encode(), tag="t1"),
        expected(2, topic="Payments", body=b"c"), expected(3, topic="Orders", body=b"d")]
    born = encoded[0].wire.system_properties.born_timestamp
    assert born.seconds > 1_700_000_000  # the chunk's encoding time


def test_rows_with_keys_properties_groups_and_delivery_times_encode_as_to_protocol_does():
    at_ms = int(NOW.timestamp() * 1000)
    rows = [{"body": b"a", "keys": "k1 k2", "properties": {"p": "v"}},
            {"body": b"b", "message_group": "g1", "tags": "t"},
            {"body": b"c", "delivery_timestamp": at_ms, "keys": ["x"]}]
    (chunk,) = chunks_of_rows(rows, 10)
    encoded, _ = encoder().encode(chunk)
    assert [got(r.wire) for r in encoded] == [
        expected(0, topic="Orders", body=b"a", keys=["k1", "k2"], properties={"p": "v"}),
        expected(1, topic="Orders", body=b"b", message_group="g1", tag="t"),
        expected(2, topic="Orders", body=b"c", keys=["x"], delivery_time=NOW)]


def test_refused_rows_are_named_by_position_and_the_rest_encode():
    rows = [{"body": b"ok"}, {"body": None}, {"body": b""}, {"body": b"x" * 2000}, {"body": b"ok", "topic": ""}]
    (chunk,) = chunks_of_rows(rows, 10)
    encoded, refused = encoder(topic="Orders").encode(chunk)
    assert [r.position for r in encoded] == [0, 4]
    assert [(r.position, type(r.error)) for r in refused] == [
        (1, BadRowError), (2, BadRequestError), (3, PayloadTooLargeError)]
    (chunk,) = chunks_of_rows([{"body": b"x"}], 10)
    _, refused = encoder(topic=None).encode(chunk)
    assert "no topic" in str(refused[0].error)


@pytest.mark.parametrize("size", [1, 3, 500])
def test_chunks_keep_each_rows_position_across_batches(size: int):
    batches = [pa.record_batch([pa.array([b"%d" % i for i in range(start, start + n)])], names=["body"])
               for start, n in ((0, 4), (4, 0), (4, 3))]
    chunks = list(chunks_of_batches(batches, size))
    assert all(0 < len(c) <= size for c in chunks)
    assert [(c.first + i, body) for c in chunks for i, body in enumerate(c.columns["body"])] == \
        [(i, b"%d" % i) for i in range(7)]
    bodies = [b"%d" % i for i in range(7)]
    assert [(c.first, list(c.columns["body"])) for c in chunks_of_rows([{"body": b} for b in bodies], size)] == \
        [(start, bodies[start:start + size]) for start in range(0, 7, size)]
