"""The `dledger` sink against three real node processes (their brokers): rows
written through Spark land once each; a task that fails after sending half
its rows and is retried leaves no duplicate (the broker recognises the
derived message ids); bad rows fail with their topic and index, or are
skipped and counted; overwrite is refused."""
from __future__ import annotations

import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from spark.options import OptionError
from spark.sink import BadRowError, SinkOptions, _Writer, is_bad_row
from tests.spark.helpers import run, topic_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]
NODE_ARGS = ["--data-file-size", str(16 << 20), "--index-file-size", str(1 << 20), "--preallocate", "false"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> str:
    cluster = ProcessCluster(tmp_path_factory.mktemp("sink-cluster"), extra_args=NODE_ARGS)
    cluster.start()

    async def leader() -> str:
        async with DLedgerClient(list(cluster.addresses.values())) as client:
            return await find_leader(client, list(cluster.addresses.values()), timeout=60.0)
    run(leader())
    yield ",".join(cluster.addresses.values())
    cluster.stop_all()


def sink_options(servers: str, topic: str, **extra: str):  # noqa: ANN201
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType
    schema = StructType([StructField("body", BinaryType()), StructField("tags", StringType())])
    return SinkOptions.parse({"servers": servers, "topic": topic, **extra}, schema)


def test_a_retried_task_leaves_no_duplicate(servers):
    rows = [{"body": b"retry-%d" % i, "tags": "t"} for i in range(400)]
    writer = _Writer(sink_options(servers, "SinkRetry", batchSize="50", failFirstAttemptAfterRows="200"))
    with pytest.raises(RuntimeError, match="stops after 200 rows"):
        writer.write_rows(rows, "write-1", partition=3, attempt=0)
    # The first attempt stored part of the rows (batches in flight when it failed included).
    assert 200 <= len(topic_rows(servers, "SinkRetry")) < 400
    commit = writer.write_rows(rows, "write-1", partition=3, attempt=1)
    assert (commit.sent, commit.skipped) == (400, 0)
    stored = topic_rows(servers, "SinkRetry")
    assert sorted(r["body"] for r in stored) == sorted(r["body"] for r in rows)  # each once
    assert len({r["message_id"] for r in stored}) == 400
    # Another write of the same rows is new data, not a retry.
    _Writer(sink_options(servers, "SinkRetry")).write_rows(rows[:10], "write-2", partition=3, attempt=0)
    assert len(topic_rows(servers, "SinkRetry")) == 410


def test_bad_rows_fail_with_their_topic_and_index_or_are_skipped(servers):
    rows = [{"body": b"ok-0"}, {"body": b"ok-1"}, {"body": None}, {"body": b"ok-3"}, {"body": b""}]
    with pytest.raises(BadRowError, match="row 2 of partition 0 \\(topic 'SinkBad'\\): no body"):
        _Writer(sink_options(servers, "SinkBad")).write_rows(rows, "bad-1", 0, 0)
    commit = _Writer(sink_options(servers, "SinkBad", onBadRow="skip")).write_rows(rows, "bad-2", 0, 0)
    assert (commit.sent, commit.skipped) == (3, 2)
    illegal = [{"body": b"x", "topic": "no spaces allowed"}]
    with pytest.raises(BadRowError, match="row 0 of partition 0 \\(topic 'no spaces allowed'\\)"):
        from pyspark.sql.types import BinaryType, StringType, StructField, StructType
        schema = StructType([StructField("body", BinaryType()), StructField("topic", StringType())])
        _Writer(SinkOptions.parse({"servers": servers}, schema)).write_rows(illegal, "bad-3", 0, 0)


def test_a_message_groups_rows_land_in_row_order_across_chunks(servers):
    """Rows with a message group are sent as FIFO messages, one chunk at a time
    (spark/sink.py: a retried chunk cannot then land behind the next one): each
    group stays on one queue, in the partition's row order across 22 chunks."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from broker.client import AdminClient

    async def fifo_topic() -> None:
        async with AdminClient(servers.split(",")) as admin:
            await admin.create_topic("SinkFifo", 4, "fifo")
    run(fifo_topic())
    schema = StructType([StructField("body", BinaryType()), StructField("message_group", StringType())])
    options = SinkOptions.parse({"servers": servers, "topic": "SinkFifo", "batchSize": "7"}, schema)
    assert options.ordered
    rows = [{"body": b"fifo-%03d" % i, "message_group": "g%d" % (i % 2)} for i in range(150)]
    commit = _Writer(options).write_rows(rows, "fifo-1", 0, 0)
    assert (commit.sent, commit.skipped) == (150, 0)
    stored = topic_rows(servers, "SinkFifo")
    for group in ("g0", "g1"):
        mine = [r for r in stored if r["body"].startswith(b"fifo-") and int(r["body"][5:]) % 2 == int(group[1])]
        assert len({r["queue_id"] for r in mine}) == 1   # a group stays on one queue
        in_queue_order = [r["body"] for r in sorted(mine, key=lambda r: r["queue_offset"])]
        assert in_queue_order == [row["body"] for row in rows if row["message_group"] == group]


def test_spark_writes_rows_that_land_exactly_once(spark_session, servers):
    df = spark_session.range(10_000).selectExpr("concat('spark-', id) AS body", "'t' || (id % 3) AS tags",
                                                 "array('k' || id) AS keys", "map('source', 'spark') AS properties")
    df.repartition(4).write.format("dledger").mode("append").option("servers", servers) \
        .option("topic", "SinkSpark").save()
    stored = topic_rows(servers, "SinkSpark")
    assert len(stored) == 10_000
    assert sorted(r["body"] for r in stored) == sorted(b"spark-%d" % i for i in range(10_000))
    assert len({r["message_id"] for r in stored}) == 10_000
    sample = next(r for r in stored if r["body"] == b"spark-7")
    assert (sample["tags"], sample["keys"], dict(sample["properties"])["source"]) == ("t1", ["k7"], "spark")
    with pytest.raises(Exception, match="a topic is only appended to"):
        df.limit(1).write.format("dledger").mode("overwrite").option("servers", servers) \
            .option("topic", "SinkSpark").save()
    with pytest.raises(Exception, match="does not know column"):
        df.limit(1).selectExpr("body", "1 AS nope").write.format("dledger").mode("append") \
            .option("servers", servers).option("topic", "SinkSpark").save()


def test_only_the_brokers_refusals_of_a_row_are_bad_rows():
    """An unavailable cluster or an unknown outcome fails the task (Spark
    retries it with the same ids); counting it as a bad row would make
    onBadRow=skip drop rows that were never refused."""
    from broker.client.errors import error_for
    from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

    refusals = [pb.ILLEGAL_TOPIC, pb.MESSAGE_BODY_TOO_LARGE, pb.TOPIC_NOT_FOUND, pb.MESSAGE_BODY_EMPTY]
    failures = [pb.HA_NOT_AVAILABLE, pb.MASTER_PERSISTENCE_TIMEOUT, pb.PROXY_TIMEOUT, pb.INTERNAL_SERVER_ERROR,
                pb.FORBIDDEN, pb.TOO_MANY_REQUESTS]
    assert [is_bad_row(error_for(code, "x")) for code in refusals] == [True] * len(refusals)
    assert [is_bad_row(error_for(code, "x")) for code in failures] == [False] * len(failures)


def test_sink_options_are_checked(servers):
    with pytest.raises(OptionError, match="unknown sink option 'topik'"):
        sink_options(servers, "T", topik="x")
    with pytest.raises(OptionError, match="onBadRow: expected fail or skip"):
        sink_options(servers, "T", onBadRow="ignore")


def test_a_stream_into_the_sink_copies_each_message_once_across_a_restart(spark_session, servers, tmp_path):
    """Live source -> dledger sink into a second topic, availableNow, run twice
    on one checkpoint with more messages in between, and a third time with a
    forged replay of the last micro-batch (its commit removed from the
    checkpoint): the copy holds each source message exactly once."""
    source_rows = [{"body": b"stream-%d" % i} for i in range(300)]
    _Writer(sink_options(servers, "StreamSource")).write_rows(source_rows[:200], "src-1", 0, 0)
    checkpoint = tmp_path / "ck"

    def copy_once() -> None:
        query = spark_session.readStream.format("dledger").option("servers", servers) \
            .option("topic", "StreamSource").option("startingOffsets", "earliest").load() \
            .selectExpr("body", "'copied' AS tags").writeStream.format("dledger").option("servers", servers) \
            .option("topic", "StreamCopy").option("checkpointLocation", str(checkpoint)) \
            .trigger(availableNow=True).start()
        query.awaitTermination(240)
        assert query.exception() is None

    copy_once()
    _Writer(sink_options(servers, "StreamSource")).write_rows(source_rows[200:], "src-2", 0, 0)
    copy_once()
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    # As if the driver died after the sink wrote the last batch but before it recorded the commit.
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    copy_once()
    copied = topic_rows(servers, "StreamCopy")
    assert sorted(r["body"] for r in copied) == sorted(r["body"] for r in source_rows)
