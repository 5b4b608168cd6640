"""The vectorised decoder (spark/vector_decode.py) against the reference
(the row-by-row scan of spark/entry_scan.py and decoder of spark/row_builder.py),
entry by entry and column by column, on a real DLedger file store holding every
kind of entry, and on damaged copies of it. No Spark session: plain Arrow."""
from __future__ import annotations

import os
import random
import shutil
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.entry import CHANNEL_LOG_API, CHANNEL_STATE_MACHINE, MAGIC_NOOP, MAGIC_PRODUCER_MARK
from dledger.store.file_store import DLedgerFileStore
from spark import vector_decode
from spark.entry_scan import scan_file_range
from spark.log_files import LogFiles, LogFilesError
from spark.partitions import plan_file_ranges
from spark.row_builder import RowBatchBuilder, scanned_record_batches
from spark.schema import ARROW_SCHEMA
from store.codec import MessageExt, encode
from store.consumer_offset import offsets_payload
from store.socket_address import SocketAddress
from store.system_entry import SystemKind, encode_system_entry

V4 = SocketAddress("10.0.0.7", 4242)
V6 = SocketAddress("2001:db8::1", 4243)
ENTRIES = 3000


def message(i: int, rng: random.Random) -> bytes:
    """One of every message shape, chosen by i."""
    shape = i % 12
    properties = {"TAGS": f"tag{i % 7}", "KEYS": f"order-{i} user-{i % 13}", "UNIQ_KEY": f"01{i:032X}"}
    topic, born, store, sys_flag, body = "Orders" if i % 3 else "Payments", V4, V4, 0, rng.randbytes(i % 300)
    if shape == 1:
        born = V6
    elif shape == 2:
        store = V6
        properties["KEYS"] = "  spaced   keys "  # empty keys are dropped
    elif shape == 3:
        properties = {}
    elif shape == 4:
        properties = {f"p{k}": "v" * 200 for k in range(150)}  # about 30 KB of properties
    elif shape == 5:
        topic = "Long-" + "t" * 140  # V2 magic: a 2-byte topic length
    elif shape == 6:
        topic, properties = "Ünïcodé", {"TAGS": "ä", "x": ""}
    elif shape == 7:
        body = b""
        sys_flag = 8
    elif shape == 8:
        born, store = V6, V6
        properties = {"TAGS": "six"}
    record = bytearray(encode(MessageExt(topic=topic, body=body, queue_id=i % 4, queue_offset=i, sys_flag=sys_flag,
                                         born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_500 + i,
                                         born_host=born, store_host=store, properties=properties)))
    if shape == 9:  # no trailing separator after the last property: still readable
        record = _without_trailing_separator(record)
    return bytes(record)


def _without_trailing_separator(record: bytearray) -> bytearray:
    # The record ends with the int16 length and the text, which ends with \x02.
    assert record[-1] == 2
    text_length_at = _properties_length_at(record)
    length = struct.unpack_from(">h", record, text_length_at)[0]
    struct.pack_into(">h", record, text_length_at, length - 1)
    record = record[:-1]
    struct.pack_into(">i", record, 0, len(record))
    return record


def _properties_length_at(record: bytearray) -> int:
    from store.codec import peek
    request = peek(bytes(record))
    end = request.body_offset + request.body_length
    topic_header = 1 if request.topic.encode() and len(request.topic.encode()) <= 127 else 2
    return end + topic_header + len(request.topic.encode())


def odd_body(i: int) -> bytes:
    """Bodies the state machine might hold that are not plain messages."""
    kind = i % 5
    if kind == 0:
        return encode_system_entry(SystemKind.CONSUMER_OFFSETS, offsets_payload([("g", "Orders", i % 4, i)]))
    if kind == 1:
        return b"not a record at all"
    if kind == 2:  # a message magic, but framing that does not add up
        return b"\x00\x00\x00\x10\xda\xa3\x20\xa7broken message"
    if kind == 3:  # a topic that is not UTF-8
        record = bytearray(encode(MessageExt(topic="Badtopic", body=b"x", born_host=V4, store_host=V4)))
        at = record.index(b"Badtopic")
        record[at] = 0xFF
        return bytes(record)
    # an IPv6 record whose properties repeat a name: the strict codec collapses them
    return _repeated_property(encode(MessageExt(topic="Dup", body=b"d", born_host=V6, store_host=V6,
                                                properties={"AAAA": "1", "BBBB": "2"})))


def _repeated_property(record: bytes) -> bytes:
    return record.replace(b"BBBB\x012", b"AAAA\x012")


def corpus_store(directory: Path) -> DLedgerFileStore:
    return DLedgerFileStore(DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1),),
                                          data_dir=str(directory), preallocate=False, data_file_size=1 << 20,
                                          index_file_size=32 * 1024, max_entry_size=200 << 10))


def build_corpus(directory: Path) -> int:
    """A node's files: client (raw) entries, NOOPs, producer marks, system
    entries, odd records and messages of every shape, over several data and
    index segments. Returns the committed index."""
    store = corpus_store(directory)
    store.open()
    rng = random.Random(21)
    i = 0
    while i < ENTRIES:
        choice = i % 50
        if choice == 0:
            store.append_as_leader([b""], term=1 + i // 1000, magic=MAGIC_NOOP)
        elif choice == 1:
            store.append_as_leader([b"producer-mark"], term=1 + i // 1000, magic=MAGIC_PRODUCER_MARK)
        elif choice < 5:
            store.append_as_leader([rng.randbytes(i % 40)], term=1 + i // 1000, channel=CHANNEL_LOG_API)
        elif choice < 10:
            store.append_as_leader([odd_body(i)], term=1 + i // 1000, channel=CHANNEL_STATE_MACHINE)
        else:
            batch = [message(i + k, rng) for k in range(10)]
            store.append_as_leader(batch, term=1 + i // 1000, channel=CHANNEL_STATE_MACHINE)
            i += len(batch) - 1
        i += 1
    store.set_committed_index(store.ledger_end_index)
    committed = store.ledger_end_index
    store.close()
    return committed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    directory = tmp_path_factory.mktemp("vector-corpus")
    return directory, build_corpus(directory)


def ranges(directory: Path, committed: int, partition_bytes: int = 300 << 10):
    files = LogFiles.locate(str(directory))
    return plan_file_ranges(files, 0, committed, partition_bytes)


def reference_table(parts, topics=None) -> pa.Table:
    return pa.Table.from_batches([b for part in parts for b in scanned_record_batches(scan_file_range(part), topics)],
                                 ARROW_SCHEMA)


def vector_table(parts, topics=None, columns=None) -> pa.Table:
    schema = vector_decode.output_schema(columns)
    return pa.Table.from_batches([b for part in parts for b in vector_decode.file_range_batches(part, topics, columns)],
                                 schema)


def test_the_corpus_has_every_kind_and_uses_the_index_files(corpus):
    directory, committed = corpus
    parts = ranges(directory, committed)
    assert len({part.path for part in parts}) > 3 and all(part.index_segments for part in parts)
    assert any(len(part.index_segments) > 1 for part in parts)  # a range across two index files
    kinds = reference_table(parts).group_by("kind").aggregate([("index", "count")]).to_pydict()
    assert sorted(kinds["kind"]) == ["message", "raw", "system"]


class CountingBuilder(RowBatchBuilder):
    """The reference builder, counting the entries the vectorised decoder hands it."""
    entries = 0

    def extend(self, entries):
        entries = list(entries)
        CountingBuilder.entries += len(entries)
        return super().extend(entries)


@pytest.fixture()
def counted(monkeypatch):
    CountingBuilder.entries = 0
    monkeypatch.setattr(vector_decode, "RowBatchBuilder", CountingBuilder)
    return CountingBuilder


def test_vectorised_rows_equal_the_reference_entry_by_entry(corpus, counted):
    directory, committed = corpus
    parts = ranges(directory, committed)
    expected, got = reference_table(parts), vector_table(parts)
    # Only the system entries and the odd records (300 of 3000) are the reference's to decode.
    assert 0 < counted.entries <= 300
    assert got.schema.equals(ARROW_SCHEMA)
    assert got.num_rows == expected.num_rows > 2500
    for name in ARROW_SCHEMA.names:  # column by column, so a failure names the column and the row
        want, have = expected.column(name).to_pylist(), got.column(name).to_pylist()
        for row, (a, b) in enumerate(zip(want, have)):
            assert a == b, f"column {name}, row {row} (index {expected.column('index')[row]}): {a!r} != {b!r}"


def test_a_topic_filter_and_column_pruning_agree_with_the_reference(corpus, counted):
    directory, committed = corpus
    parts = ranges(directory, committed)
    topics = frozenset({"Payments", "Dup"})
    assert vector_table(parts, topics).equals(reference_table(parts, topics))
    pruned = vector_table(parts, None, ["index", "topic", "queue_offset"])
    assert pruned.schema.names == ["index", "topic", "queue_offset"]
    assert pruned.equals(reference_table(parts).select(["index", "topic", "queue_offset"]))
    assert counted.entries <= 2 * 300


def test_column_pruning_does_not_build_body_or_properties(corpus, monkeypatch):
    directory, committed = corpus
    parts = ranges(directory, committed)
    built: list[bool] = []
    original_gather = vector_decode._gather

    def gather(v, starts, lengths, text, valid=None):
        built.append(text)
        return original_gather(v, starts, lengths, text, valid)

    def split(*args):
        raise AssertionError("properties were split for a query that does not use them")

    monkeypatch.setattr(vector_decode, "_gather", gather)
    monkeypatch.setattr(vector_decode, "_split_properties", split)
    vector_table(parts, None, ["index", "kind", "topic", "store_size"])
    assert built and all(built)  # only topics (text) were gathered: no body


@pytest.mark.parametrize("damage", ["body", "header", "chain"])
def test_a_damaged_entry_is_refused_with_the_reference_error(corpus, tmp_path, damage):
    directory, committed = corpus
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    files = LogFiles.locate(str(copy))
    victim = committed // 2
    pos, size, _ = files.index_record(victim)
    segment = files.data_segment_of(pos)
    relative = pos - segment.start
    with open(segment.path, "r+b") as f:
        if damage == "body":
            at = relative + size - 1
        elif damage == "header":
            at = relative + 9  # inside the index field
        else:
            at = relative + 20  # the term: covered by the chain CRC only
        byte = os.pread(f.fileno(), 1, at)
        os.pwrite(f.fileno(), bytes([byte[0] ^ 0x10]), at)
    parts = ranges(copy, committed)
    with pytest.raises(LogFilesError) as reference_error:
        reference_table(parts)
    with pytest.raises(LogFilesError) as vector_error:
        vector_table(parts)
    assert str(vector_error.value) == str(reference_error.value)
    assert f"entry {victim}" in str(vector_error.value)


def test_without_index_files_the_reference_walk_is_used(corpus, tmp_path):
    directory, committed = corpus
    copy = tmp_path / "segments"
    shutil.copytree(directory / "dledger-n0" / "data", copy)
    shutil.copy(directory / "dledger-n0" / "checkpoint", copy / "checkpoint")
    parts = ranges(copy, committed)
    assert not any(part.index_segments for part in parts)
    assert vector_table(parts).equals(reference_table(parts))


def test_chain_crcs_are_what_zlib_says(corpus):
    """The chain check's 40-byte rows are the header bytes dledger/entry.py covers."""
    directory, committed = corpus
    files = LogFiles.locate(str(directory))
    pos, _, _ = files.index_record(5)
    segment = files.data_segment_of(pos)
    with open(segment.path, "rb") as f:
        header = os.pread(f.fileno(), 48, pos - segment.start)
    previous = files.chain_crc_at(files.index_record(4)[0])
    row = header[:36] + header[40:44]
    assert zlib.crc32(row, previous) == int.from_bytes(header[36:40], "big")


def raw_runs(directory: Path, committed: int, run_bytes: int = 64 << 10) -> list[tuple[bytes, bytes]]:
    """The runs a node's raw read (ReadRequest.raw) answers for the whole log."""
    store = corpus_store(directory)
    store.open()
    try:
        runs, index = [], 0
        while index <= committed:
            records, data, count = store.read_raw_run(index, run_bytes, committed - index + 1)
            assert count
            runs.append((records, data))
            index += count
        return runs
    finally:
        store.close()


def raw_table(runs: list[tuple[bytes, bytes]], topics=None, columns=None) -> pa.Table:
    schema, tag_codes, chain, batches = vector_decode.output_schema(columns), {}, None, []
    for records, data in runs:
        batch, chain = vector_decode.raw_run_batch(records, data, chain, topics, schema, tag_codes)
        batches.append(batch)
    return pa.Table.from_batches(batches, schema)


def test_raw_runs_as_a_node_serves_them_decode_to_the_reference_rows(corpus):
    # What the live source does with a node's raw reads: runs inside one
    # data segment each, decoded with every CRC checked, the chain CRC
    # carried from run to run.
    directory, committed = corpus
    runs = raw_runs(directory, committed)
    assert len(runs) > len(LogFiles.locate(str(directory)).data)  # several runs per segment, none across two
    expected = reference_table(ranges(directory, committed))
    assert raw_table(runs).equals(expected)
    topics = frozenset({"Payments"})
    assert raw_table(runs, topics, ["index", "topic", "body"]).equals(
        reference_table(ranges(directory, committed), topics).select(["index", "topic", "body"]))


@pytest.mark.parametrize("damage", ["body", "header", "chain", "records"])
def test_a_raw_run_that_disagrees_with_itself_is_refused(corpus, damage):
    directory, committed = corpus
    runs = raw_runs(directory, committed)
    chain = vector_decode.raw_run_batch(*runs[3], None, None, vector_decode.output_schema(None), {})[1]
    records, data = runs[4]
    if damage == "records":
        records = records[:-32]  # the data holds one entry more than the records name
    else:
        first_size = int.from_bytes(records[12:16], "big")
        at = {"body": first_size - 1, "header": 9, "chain": 20}[damage]
        data = data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]
    with pytest.raises(vector_decode.ChunkError):
        vector_decode.raw_run_batch(records, data, chain, None, vector_decode.output_schema(None), {})
    if damage != "records":
        # A wrong link to the previous run is caught too.
        with pytest.raises(vector_decode.ChunkError):
            vector_decode.raw_run_batch(*runs[4], chain ^ 1, None, vector_decode.output_schema(None), {})
