"""The JVM reader in live mode (spark/jvm: LiveGroup plans, LiveRuns reads raw
runs from the nodes' HTTP ports (RawHttp, sent from their files) or over gRPC
on Spark's own Netty, RangeReader decodes) against three real node processes
with metrics ports, as `dledger cluster up` starts them: it returns what the
Python reader returns, column by column, for every option it takes and over
both transports; a query it does not take goes to the Python
reader; a follower SIGKILLed in the middle of a read, or a follower whose copy
of an entry is damaged on disk, costs the read nothing: the range is read
again from the next node; a read planned while the leader is dead gets the
followers' committed range. (Secured clusters: test_secure_live.py, both readers.)"""
from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from tests.metrics_scrape import counter_total
from tests.spark.helpers import committed_entries, leader_of, run, send_messages, wait_applied, wait_followers_committed

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

# Small segments, so that a read crosses several; no scrubbing pass while a
# test runs, so that a byte damaged on disk stays damaged until a read meets it.
NODE_ARGS = ["--data-file-size", str(1 << 20), "--max-entry-size", str(64 << 10), "--index-file-size",
             str(64 << 10), "--preallocate", "false", "--scrub-pass-interval", "3600"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("jvm-live"), extra_args=NODE_ARGS, metrics=True)
    c.start()
    run(leader_of(c))
    # Every kind of row: RocketMQ messages of two topics (tags, keys,
    # properties), raw entries, and the system entries the broker writes.
    run(send_messages(c.addresses["n0"], "Orders", 300))
    run(send_messages(c.addresses["n1"], "Payments", 120, batch=7))
    run(append(c, [b"raw-%d-" % i + os.urandom(300) for i in range(400)]))
    yield c
    c.stop_all()


@pytest.fixture(scope="module")
def spark(spark_session):
    from spark.jvm_reader import on_classpath

    if not on_classpath(spark_session):
        pytest.skip("the JVM reader is not on the session's classpath (no javac? spark.jvm_reader logs why)")
    return spark_session


async def append(cluster: ProcessCluster, bodies: list[bytes]) -> int:
    async with DLedgerClient(list(cluster.addresses.values())) as client:
        last = 0
        for start in range(0, len(bodies), 100):
            last = (await client.append(bodies[start:start + 100])).last_index
        return last


def servers(cluster: ProcessCluster) -> str:
    return ",".join(cluster.addresses.values())


def live(spark, cluster: ProcessCluster, reader: str, **options: str):  # noqa: ANN001, ANN201
    frame = spark.read.format("dledger").option("servers", servers(cluster)).option("reader", reader)
    for name, value in options.items():
        frame = frame.option(name, value)
    return frame.load()


def rows(frame) -> list[tuple]:  # noqa: ANN001
    """Every row, by index; maps as sorted item lists (Rows hold dicts)."""
    return sorted(tuple(sorted(v.items()) if isinstance(v, dict) else v for v in row) for row in frame.collect())


def plan(frame) -> str:  # noqa: ANN001
    return frame._jdf.queryExecution().executedPlan().toString()


def test_the_jvm_live_reader_reads_what_the_python_reader_reads(spark, cluster):
    end = max(run(committed_entries(servers(cluster))))
    for options in ({}, {"topic": "Payments"}, {"includeProperties": "false", "startIndex": "100"},
                    {"preferReplicas": "false", "minPartitions": "5"}, {"entriesPerPartition": "97"},
                    {"startingOffsets": "250", "endIndex": str(end - 30)}, {"liveTransport": "grpc"}):
        options = {"endIndex": str(end), **options}  # the same committed range for both readers
        jvm = live(spark, cluster, "jvm", **options)
        assert "dledger JVM reader live" in plan(jvm), options
        python = live(spark, cluster, "python", **options)
        assert "dledger JVM reader" not in plan(python)
        got, want = rows(jvm), rows(python)
        assert got == want, options
        assert len(want) > (100 if "topic" in options else 500), options
    kinds = {row["kind"] for row in live(spark, cluster, "jvm").select("kind").distinct().collect()}
    assert kinds == {"message", "raw", "system"}


@pytest.mark.parametrize("reader", ["jvm", "python"])
def test_runs_come_over_http_unless_grpc_is_asked_for(spark, cluster, reader):
    end = str(max(run(committed_entries(servers(cluster)))))
    for transport, over_http in (("auto", True), ("grpc", False)):
        before = counter_total(cluster.metrics_ports.values(), "dledger_raw_http_read_bytes_total")
        assert live(spark, cluster, reader, endIndex=end, liveTransport=transport).count() > 500
        assert (counter_total(cluster.metrics_ports.values(), "dledger_raw_http_read_bytes_total") > before) == over_http, transport


def test_pruned_columns_and_partitions(spark, cluster):
    end = str(max(run(committed_entries(servers(cluster)))))
    frame = live(spark, cluster, "auto", entriesPerPartition="200", endIndex=end).select("index", "topic")
    assert "dledger JVM reader live" in plan(frame)
    assert frame.rdd.getNumPartitions() >= 4
    python = live(spark, cluster, "python", entriesPerPartition="200", endIndex=end).select("index", "topic")
    assert rows(frame) == rows(python)


def test_queries_the_jvm_live_reader_does_not_take_go_to_the_python_reader(spark, cluster):
    pattern = live(spark, cluster, "auto", subscribePattern="Pay.*")
    assert "dledger JVM reader" not in plan(pattern)
    assert {r["topic"] for r in pattern.select("topic").collect()} == {"Payments"}
    with pytest.raises(Exception, match="reader=jvm: the JVM reader cannot read this query"):
        live(spark, cluster, "jvm", subscribePattern="Pay.*").collect()
    with pytest.raises(Exception, match="unknown option 'startindx'"):
        live(spark, cluster, "auto", startIndx="4").collect()


def test_a_follower_killed_in_the_middle_of_a_read_costs_nothing(spark, tmp_path):
    c = ProcessCluster(tmp_path, extra_args=NODE_ARGS, metrics=True)
    c.start()
    try:
        leader = run(leader_of(c))
        last = run(append(c, [b"kill-%d-" % i + bytes(1000) for i in range(3000)]))
        followers = sorted((address, node) for node, address in c.addresses.items() if node != leader)
        # Two partitions, one per follower, each throttled to about 3 s, so
        # that the kill lands in the middle of both reads.
        frame = live(spark, c, "jvm", endIndex=str(last), minPartitions="2", maxBytesPerSecond=str(600 << 10))
        got: list = []
        reading = threading.Thread(target=lambda: got.extend(frame.select("index", "body").collect()))
        reading.start()
        time.sleep(1.5)
        c.kill(followers[0][1])
        reading.join(120)
        assert not reading.is_alive()
        want = {i: b for i, b in run(committed_entries(servers(c))).items() if i <= last}
        assert len(got) == len(want) and {r["index"]: bytes(r["body"]) for r in got} == want
    finally:
        c.stop_all()


def test_a_read_planned_while_the_leader_is_dead_returns_the_committed_range(spark, tmp_path):
    c = ProcessCluster(tmp_path, extra_args=NODE_ARGS, metrics=True)
    c.start()
    try:
        leader = run(leader_of(c))
        last = run(append(c, [b"before-kill-%d" % i for i in range(500)]))
        run(wait_followers_committed(c, last))
        c.kill(leader)
        # Planned in the election (the followers' bounds), read from the followers.
        got = {r["index"]: bytes(r["body"])
               for r in live(spark, c, "jvm", endIndex=str(last)).select("index", "body").collect()}
        want = {i: b for i, b in run(committed_entries(servers(c))).items() if i <= last}
        assert got == want and len(want) >= 500
    finally:
        c.stop_all()


def test_a_copy_damaged_on_a_followers_disk_is_read_from_another_node(spark, tmp_path):
    c = ProcessCluster(tmp_path, extra_args=NODE_ARGS, metrics=True)
    c.start()
    try:
        leader = run(leader_of(c))
        marker = b"damage-me-" + os.urandom(8).hex().encode()
        last = run(append(c, [b"before-%d" % i for i in range(200)] + [marker + bytes(100)]
                          + [b"after-%d" % i for i in range(200)]))
        first_follower = sorted((address, node) for node, address in c.addresses.items() if node != leader)[0][1]
        # Damaged only once the follower's store has applied it: its apply
        # loop reads entries back checked, and would repair a damage it met
        # (CheckedReader), which is not what this test is about.
        run(wait_applied(c.addresses[first_follower], last))
        damaged = flip_byte_after(c.base / first_follower, marker)
        assert damaged is not None, "the follower holds no copy of the marked entry"
        frame = live(spark, c, "jvm", endIndex=str(last), minPartitions="1")  # one partition: that follower first
        got = {r["index"]: bytes(r["body"]) for r in frame.select("index", "body").collect()}
        want = {i: b for i, b in run(committed_entries(servers(c))).items() if i <= last}
        assert got == want and any(b.startswith(marker) for b in got.values())
        assert damaged.read_bytes().find(marker) < 0  # still damaged: the read met it and went elsewhere
    finally:
        c.stop_all()


def flip_byte_after(node_dir: Path, marker: bytes) -> Path | None:
    """Flip the first byte after `marker` in the node's data segment that holds it."""
    for path in sorted(node_dir.rglob("*")):
        if not path.is_file() or path.stat().st_size == 0 or "data" not in str(path.parent.name):
            continue
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as view:
            at = view.find(marker)
            if at >= 0:
                view[at] ^= 0x20  # the marker's first byte: its entry's body CRC no longer matches
                view.flush()
                return path
    return None
