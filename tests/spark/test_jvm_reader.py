"""The JVM reader of file mode (spark/jvm, built by spark/jvm_reader.py) against
the Python reader (the reference): the same rows column by column on the
mixed corpus of test_vector_decode (every kind of entry, odd records, several
segments), only committed entries, the same errors on a damaged entry, column
pruning in the plan, and the queries it leaves to the Python source (live-only
and row-selecting options, streams over the files) still answered by it.
One SparkSession (conftest), one corpus."""
from __future__ import annotations

import os
import shutil

import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.entry import CHANNEL_STATE_MACHINE
from dledger.store.file_store import DLedgerFileStore
from spark.log_files import LogFiles, LogFilesError
from tests.spark.test_vector_decode import build_corpus, message, ranges, reference_table

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
UNCOMMITTED = 25


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The mixed corpus plus a tail of entries beyond the checkpoint's committed index."""
    import random

    directory = tmp_path_factory.mktemp("jvm-corpus")
    committed = build_corpus(directory)
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1),), data_dir=str(directory),
                           preallocate=False, data_file_size=1 << 20, index_file_size=32 * 1024,
                           max_entry_size=200 << 10)
    store = DLedgerFileStore(config)
    store.open()
    rng = random.Random(5)
    store.append_as_leader([message(i, rng) for i in range(UNCOMMITTED)], term=9, channel=CHANNEL_STATE_MACHINE)
    store.close()
    files = LogFiles.locate(str(directory))
    assert files.committed_index == committed  # the tail is on disk but not committed
    return directory, committed


@pytest.fixture(scope="module")
def spark(spark_session):
    from spark.jvm_reader import on_classpath

    if not on_classpath(spark_session):
        pytest.skip("the JVM reader is not on the session's classpath (no javac? spark.jvm_reader logs why)")
    return spark_session


def rows(frame):
    return [row.asDict() for row in frame.orderBy("index").collect()]


def read(spark, directory, reader, **options):
    frame = spark.read.format("dledger").option("reader", reader).option("maxPartitionBytes", str(256 << 10))
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame.load(str(directory))


def plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def test_the_jvm_reader_reads_what_the_python_reader_reads(spark, corpus):
    directory, committed = corpus
    jvm = read(spark, directory, "auto")
    assert "dledger JVM reader" in plan(jvm) and "ColumnarToRow" in plan(jvm)
    assert jvm.rdd.getNumPartitions() > 3
    got, want = rows(jvm), rows(read(spark, directory, "python"))
    assert len(got) == len(want) > 2500
    assert max(r["index"] for r in got) <= committed  # the uncommitted tail is never read
    assert {r["kind"] for r in got} == {"message", "raw", "system"}
    for name in want[0]:  # column by column, so a failure names the column and the row
        for a, b in zip(got, want):
            assert a[name] == b[name], f"column {name}, index {b['index']}"


def test_options_and_pruning_as_the_python_reader(spark, corpus):
    directory, committed = corpus
    for options in ({"topic": "Payments,Dup"}, {"startIndex": "100", "endIndex": "900"},
                    {"startingOffsets": "2000"}, {"includeProperties": "false"}, {"minPartitions": "3"}):
        jvm = read(spark, directory, "jvm", **options)
        assert rows(jvm) == rows(read(spark, directory, "python", **options)), options
    # A query's own schema (a subset, nullable where ours is not), in its own order.
    schema = "topic STRING, index LONG, keys ARRAY<STRING>, tags_code LONG"
    jvm = spark.read.format("dledger").option("reader", "jvm").schema(schema).load(str(directory))
    python = spark.read.format("dledger").option("reader", "python").schema(schema).load(str(directory))
    assert jvm.columns == python.columns and rows(jvm) == rows(python)
    # Column pruning: only the columns a query uses are read (the others are never built).
    query = read(spark, directory, "jvm").selectExpr("count(*) AS n", "sum(queue_id) AS q")
    scan = [line for line in plan(query).splitlines() if "BatchScan" in line]
    assert scan and "queue_id" in scan[0] and "body" not in scan[0] and "properties" not in scan[0]
    assert query.first() == read(spark, directory, "python").selectExpr("count(*) AS n", "sum(queue_id) AS q").first()


def test_queries_the_jvm_reader_does_not_take_go_to_the_python_source(spark, corpus, tmp_path):
    directory, _ = corpus
    pattern = read(spark, directory, "auto", subscribePattern="Pay.*")  # a row selection: Python's
    assert "dledger JVM reader" not in plan(pattern)
    assert rows(pattern) == rows(read(spark, directory, "python", topic="Payments"))
    with pytest.raises(Exception, match="reader=jvm: the JVM reader cannot read this query"):
        read(spark, directory, "jvm", subscribePattern="Pay.*").collect()
    with pytest.raises(Exception, match="did you mean startIndex"):  # options are still checked by Python
        spark.read.format("dledger").option("startIndx", "40").load(str(directory)).collect()
    with pytest.raises(Exception, match="no column 'bodyy'"):
        spark.read.format("dledger").schema("index LONG, bodyy BINARY").load(str(directory)).collect()
    with pytest.raises(Exception, match="reader: expected auto, jvm or python"):
        read(spark, directory, "fast").collect()
    # A stream over the same files is the Python source's.
    query = spark.readStream.format("dledger").option("startingOffsets", "earliest").load(str(directory)).writeStream.format("memory") \
        .queryName("jvm_file_stream").option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert spark.sql("SELECT count(*) FROM jvm_file_stream").first()[0] == read(spark, directory, "python").count()


@pytest.mark.parametrize("damage", ["body", "chain"])
def test_a_damaged_entry_is_refused_with_the_reference_error(spark, corpus, tmp_path, damage):
    directory, committed = corpus
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    files = LogFiles.locate(str(copy))
    victim = committed // 2
    pos, size, _ = files.index_record(victim)
    segment = files.data_segment_of(pos)
    at = pos - segment.start + (size - 1 if damage == "body" else 20)  # the term: covered by the chain CRC only
    with open(segment.path, "r+b") as f:
        byte = os.pread(f.fileno(), 1, at)
        os.pwrite(f.fileno(), bytes([byte[0] ^ 0x10]), at)
    with pytest.raises(LogFilesError) as reference:
        reference_table(ranges(copy, committed))
    assert f"entry {victim}" in str(reference.value)
    with pytest.raises(Exception) as jvm:
        read(spark, copy, "jvm").collect()
    assert f"LogFilesError: {reference.value}" in str(jvm.value)


def test_a_bare_copy_of_the_data_segments(spark, corpus, tmp_path):
    """No index files: the JVM reader walks each segment from its first entry, as the reference does."""
    directory, _ = corpus
    copy = tmp_path / "segments"
    shutil.copytree(directory / "dledger-n0" / "data", copy)
    shutil.copy(directory / "dledger-n0" / "checkpoint", copy / "checkpoint")
    jvm = read(spark, copy, "jvm", startIndex="7")
    assert "dledger JVM reader" in plan(jvm)
    assert rows(jvm) == rows(read(spark, copy, "python", startIndex="7"))
