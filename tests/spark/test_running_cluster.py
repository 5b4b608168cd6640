"""The `dledger` source against three real node processes: a batch read of a
running node's data dir after a RocketMQ-protocol workload, a live read over
gRPC, and a file-mode stream that reads a running node's new commits once per
checkpointed run. (A live stream across restarts and faults, exactly once:
test_stream_exactly_once.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from spark.partitions import FileRange
from store import codec
from tests.spark.helpers import committed_entries, run, send_messages, wait_for_checkpoint

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

# Small segments, so that a few hundred messages span several of them (and partitions).
NODE_ARGS = ["--data-file-size", str(128 << 10), "--max-entry-size", str(32 << 10),
             "--index-file-size", str(64 << 10), "--preallocate", "false"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("spark-cluster"), extra_args=NODE_ARGS)
    c.start()
    yield c
    c.stop_all()


@pytest.fixture(scope="module")
def servers(cluster) -> str:
    async def leader() -> str:
        async with DLedgerClient(list(cluster.addresses.values())) as client:
            return await find_leader(client, list(cluster.addresses.values()))
    run(leader())
    return ",".join(cluster.addresses.values())


def up_to(entries: dict[int, bytes], last: int) -> dict[int, bytes]:
    return {index: body for index, body in entries.items() if index <= last}


async def append_raw(servers: str, bodies: list[bytes]) -> int:
    async with DLedgerClient(servers) as client:
        return (await client.append(bodies)).last_index


def test_batch_read_of_a_running_nodes_files_returns_exactly_the_committed_entries(
        spark_session, cluster, servers):
    sent = run(send_messages(servers.split(",")[0], "Orders", 240)) + \
        run(send_messages(servers.split(",")[1], "Payments", 90))
    last = max(run(committed_entries(servers)))
    for node in cluster.ids:  # the checkpoint catches up within its 3 s interval
        wait_for_checkpoint(str(cluster.base / node), node, last)

    df = spark_session.read.format("dledger").load(str(cluster.base / "n1"))
    rows = {row["index"]: row for row in df.collect()}

    # The broker may commit entries of its own meanwhile: compare with what
    # was committed up to where the read stopped (the checkpoint's index).
    committed = up_to(run(committed_entries(servers)), max(rows))
    assert max(rows) >= last
    assert set(rows) == set(committed)
    assert df.rdd.getNumPartitions() > 1  # one per segment, at least
    messages = {row["message_id"]: row for row in rows.values() if row["kind"] == "message"}
    assert len(messages) == len(sent) == 330
    for s in sent:
        row = messages[s.message_id]
        assert (row["topic"], row["body"], row["tags"], tuple(row["keys"]), row["queue_offset"]) == \
            (s.topic, s.body, s.tag, s.keys, s.queue_offset)
        assert row["properties"]["TAGS"] == s.tag
    for index, row in rows.items():
        if row["kind"] == "message":
            stored = codec.decode(committed[index])
            assert (row["queue_id"], row["physical_offset"], row["store_size"]) == \
                (stored.queue_id, stored.physical_offset, len(committed[index]))
    assert {row["kind"] for row in rows.values()} <= {"message", "system"}
    # Each queue's offsets are dense, as the broker assigned them.
    per_queue = df.where("kind = 'message'").groupBy("topic", "queue_id") \
        .agg({"queue_offset": "max", "*": "count"}).collect()
    assert all(row["max(queue_offset)"] + 1 == row["count(1)"] for row in per_queue)


def test_topic_and_index_options_select_exactly_those_entries(spark_session, cluster):
    path = str(cluster.base / "n1")
    everything = spark_session.read.format("dledger").load(path).select("index", "kind", "topic").collect()
    low, high = sorted(row["index"] for row in everything)[10], sorted(row["index"] for row in everything)[-10]

    def read(**options: str) -> list:  # noqa: ANN401
        return spark_session.read.format("dledger").options(**options).load(path).select("index", "topic").collect()

    assert sorted(r["index"] for r in read(startIndex=str(low), endIndex=str(high))) == \
        sorted(r["index"] for r in everything if low <= r["index"] <= high)
    assert sorted(r["index"] for r in read(topic="Payments")) == \
        sorted(r["index"] for r in everything if r["topic"] == "Payments")
    assert read(startIndex=str(high + 10**6)) == []  # nothing committed there yet


def test_partitions_carry_only_paths_and_index_ranges(cluster, servers):
    from spark.log_source import FileLog
    from spark.options import SourceOptions

    options = SourceOptions.parse({"path": str(cluster.base / "n0")})
    begin, committed = FileLog(options).bounds()
    partitions = FileLog(options).plan(begin, committed)
    assert all(isinstance(p, FileRange) and Path(p.path).is_file() for p in partitions)
    assert partitions[0].first_index == begin and partitions[-1].last_index == committed
    assert all(a.last_index + 1 == b.first_index for a, b in zip(partitions, partitions[1:]))


def test_live_read_equals_the_committed_log(spark_session, servers):
    appended = run(append_raw(servers, [b"live-%d" % i for i in range(50)]))

    df = spark_session.read.format("dledger").option("servers", servers).option("entriesPerPartition", "100").load()
    rows = df.select("index", "kind", "body").collect()

    end = max(row["index"] for row in rows)
    committed = up_to(run(committed_entries(servers)), end)
    assert end >= appended
    assert {row["index"] for row in rows} == set(committed)
    assert df.rdd.getNumPartitions() >= end // 100  # index ranges of 100 entries
    raw = {row["index"]: row["body"] for row in rows if row["kind"] == "raw"}
    assert raw == {i: b for i, b in committed.items() if b.startswith(b"live-")}


def test_a_file_stream_reads_a_running_nodes_new_commits_once_per_checkpointed_run(
        spark_session, cluster, servers, tmp_path):
    node_dir = str(cluster.base / "n2")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_available_now() -> None:
        query = spark_session.readStream.format("dledger").option("startingOffsets", "earliest") \
            .option("maxEntriesPerTrigger", "150").load(node_dir).select("index", "kind", "body") \
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint) \
            .trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None

    first = wait_for_checkpoint(node_dir, "n2", max(run(committed_entries(servers))))
    run_available_now()
    appended = run(append_raw(servers, [b"file-stream-%d" % i for i in range(25)]))
    second = wait_for_checkpoint(node_dir, "n2", appended)
    run_available_now()

    rows = spark_session.read.parquet(out).select("index", "body").collect()
    indexes = [row["index"] for row in rows]
    assert len(indexes) == len(set(indexes))
    assert set(indexes) == set(up_to(run(committed_entries(servers)), max(indexes)))
    assert first < appended <= second <= max(indexes)
