"""Decoding committed entry bodies into rows, without Spark: the Arrow batch
path and the row-by-row path agree on every kind of body, and the fast
IPv4 parser agrees with store.codec's general one."""
from __future__ import annotations

import datetime

import pyarrow as pa

from dledger.entry import MAGIC_NORMAL
from spark.row_builder import BODY_START, RowBatchBuilder, parse_message, record_batches, record_tuples
from spark.schema import ARROW_SCHEMA, COLUMNS
from store.codec import MessageExt, encode, peek
from store.consumer_offset import offsets_payload
from store.java_hash import tag_hash_code
from store.socket_address import SocketAddress
from store.system_entry import SystemKind, encode_system_entry

V4 = SocketAddress("10.0.0.7", 4242)
V6 = SocketAddress("2001:db8::1", 4243)


def entries() -> list[tuple[int, int, int, memoryview]]:
    bodies = [
        encode(MessageExt(topic="Orders", body=b"first", queue_id=2, queue_offset=7, born_timestamp=1_700_000_000_123,
                          store_timestamp=1_700_000_000_456, born_host=V4, store_host=V4,
                          properties={"TAGS": "paid", "KEYS": "k1  k2", "UNIQ_KEY": "01ABC"})),
        encode(MessageExt(topic="Orders", body=b"", queue_id=0, queue_offset=0, born_host=V6, store_host=V4)),
        encode(MessageExt(topic="Ünïcode-" + "t" * 130, body=b"\x00\xff", queue_id=1, sys_flag=8,
                          properties={"a": "b"})),
        encode_system_entry(SystemKind.CONSUMER_OFFSETS, offsets_payload([("g", "Orders", 2, 5)])),
        b"just bytes",
        b"\x00\x00\x00\x10\xda\xa3\x20\xa7broken message",  # a message magic, but not a record
    ]
    return [(10 + i, 3, 1000 * i, memoryview(body)) for i, body in enumerate(bodies)]


def test_arrow_batches_and_tuples_hold_the_same_rows():
    batches = list(record_batches(entries()))
    assert all(batch.schema.equals(ARROW_SCHEMA) for batch in batches)
    from_arrow = pa.Table.from_batches(batches).to_pylist()
    scanned = [(i, t, p, MAGIC_NORMAL, b) for i, t, p, b in entries()]
    from_tuples = [dict(zip(COLUMNS, row)) for row in record_tuples(scanned)]
    for row in from_tuples:  # Arrow hands maps back as (key, value) lists
        row["properties"] = None if row["properties"] is None else list(row["properties"].items())
    assert from_arrow == from_tuples


def test_a_message_row_carries_the_records_fields():
    [row] = [r for r in pa.Table.from_batches(list(record_batches(entries()[:1]))).to_pylist()]
    assert row["kind"] == "message" and row["topic"] == "Orders"
    assert (row["index"], row["term"], row["queue_id"], row["queue_offset"]) == (10, 3, 2, 7)
    assert row["physical_offset"] == 0 + BODY_START
    assert row["keys"] == ["k1", "k2"] and row["tags"] == "paid" and row["message_id"] == "01ABC"
    assert row["tags_code"] == tag_hash_code("paid")
    assert row["born_timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.timezone.utc)
    assert row["body"] == b"first" and row["store_size"] == len(entries()[0][3])


def test_system_raw_and_malformed_bodies_are_kept_as_their_kind():
    rows = pa.Table.from_batches(list(record_batches(entries()))).to_pylist()
    kinds = [(row["index"], row["kind"], row["system_kind"]) for row in rows]
    assert kinds[3:] == [(13, "system", "CONSUMER_OFFSETS"), (14, "raw", None), (15, "raw", None)]
    assert rows[3]["body"] == b'{"offsets":[["g","Orders",2,5]]}'
    assert rows[4]["body"] == b"just bytes" and rows[4]["topic"] is None
    assert rows[1]["tags_code"] == 0 and rows[1]["keys"] is None  # a message without tags or keys


def test_the_fast_parser_agrees_with_the_codec():
    for _, _, _, body in entries()[:3]:
        request = peek(body)
        topic, queue_id, queue_offset, sys_flag, born, stored, start, end, text = parse_message(body)
        assert (topic, queue_id, queue_offset, sys_flag, born, stored) == (
            request.topic, request.queue_id, request.queue_offset, request.sys_flag, request.born_timestamp,
            request.store_timestamp)
        assert (start, end - start) == (request.body_offset, request.body_length)


def test_a_topic_filter_keeps_only_those_topics_messages():
    rows = pa.Table.from_batches(list(record_batches(entries(), frozenset({"Orders"})))).to_pylist()
    assert [(row["index"], row["topic"]) for row in rows] == [(10, "Orders"), (11, "Orders")]


def test_batches_are_cut_by_rows():
    builder = RowBatchBuilder(batch_rows=2)
    cut = [builder.add(*entry) for entry in entries()]
    assert [batch.num_rows if batch is not None else 0 for batch in cut] == [0, 2, 0, 2, 0, 2]


def test_entries_a_log_client_appended_are_raw_rows_whatever_they_look_like():
    from spark.entry_scan import MAGIC_CLIENT_NORMAL
    from spark.row_builder import scanned_record_batches
    scanned = [(i, t, p, MAGIC_CLIENT_NORMAL, b) for i, t, p, b in entries()]
    for rows in (pa.Table.from_batches(list(scanned_record_batches(scanned))).to_pylist(),
                 [dict(zip(COLUMNS, row)) for row in record_tuples(scanned)]):
        assert [row["kind"] for row in rows] == ["raw"] * len(scanned)
        assert [bytes(row["body"]) for row in rows] == [bytes(e[3]) for e in entries()]
