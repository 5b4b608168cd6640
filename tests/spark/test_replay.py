"""The committed bound of file reads and the replay job, on the files of
MessageStores running on real DLedgerServers (tests/unit/store_harness.py):
nothing above a node's committed index is read even when its log holds
uncommitted entries; the replay's summary, consumer lag and ConsumeQueue
check on a healthy cluster; a tampered ConsumeQueue file named by the check;
and the CLI on executors in separate processes (local-cluster mode)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.store.properties import read_properties
from spark.log_files import LogFiles
from spark.replay import ReplayRequest, run_replay
from spark.session import QUICK_START_JAVA_OPTIONS
from store.errors import StoreError
from store.topic_config import TopicConfig
from tests.unit.store_harness import StoreCluster, message

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
# Elections slow enough that an isolated leader keeps leading (check-quorum)
# while its uncommitted appends time out.
SLOW_ELECTIONS = dict(election_timeout_min_s=1.5, election_timeout_max_s=2.0, max_wait_ack_s=0.5)
# The store's periodic flush only at shutdown: a periodic flush cancelled by
# shutdown leaves its checkpoint write running in a thread, racing the final
# one for the same temp file (MessageStore.shutdown; reported, not ours to fix).
QUIET_STORE = {"flush_interval_s": 3600.0}


async def broker_workload(base: str) -> dict:
    """Two topics over several queues, tags and keys, a group's offsets; then a clean stop."""
    cluster = StoreCluster(base, store=QUIET_STORE)
    await cluster.start()
    try:
        store = await cluster.leader_store()
        await store.update_topic(TopicConfig("Orders", read_queue_nums=3, write_queue_nums=3))
        await store.update_topic(TopicConfig("Audit", read_queue_nums=1, write_queue_nums=1))
        for round_ in range(4):
            await store.put_messages([message("Orders", b"order-%d-%d" % (round_, i), queue_id=i % 3,
                                              tags=f"t{i % 2}", keys=f"o{round_}-{i}") for i in range(30)])
        await store.put_messages([message("Audit", b"audit-%d" % i, tags="audit") for i in range(7)])
        await store.commit_offsets([("billing", "Orders", 0, 10), ("billing", "Orders", 1, 40),
                                    ("audit-reader", "Audit", 0, 3), ("gone", "Audit", 0, 1)])
        await store.commit_offsets([("billing", "Orders", 1, 12)])  # the later commit wins
        await cluster.wait_applied()
        # The snapshot holds every offset committed so far; commits after it still count.
        assert await store.write_metadata_snapshot()
        await store.commit_offsets([("audit-reader", "Audit", 0, 5)])
        await cluster.wait_applied()
    finally:
        await cluster.stop()
    return {"Orders": {0: 40, 1: 40, 2: 40}, "Audit": {0: 7}}


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> tuple[str, dict]:
    base = str(tmp_path_factory.mktemp("replay-workload"))
    expected = asyncio.run(broker_workload(base))
    return base, expected


def test_a_file_read_stops_at_the_committed_index_though_the_log_holds_more(spark_session, tmp_path):
    async def leave_uncommitted_entries() -> str:
        cluster = StoreCluster(str(tmp_path), store=QUIET_STORE, **SLOW_ELECTIONS)
        await cluster.start()
        store = await cluster.leader_store()
        leader = next(n for n, s in cluster.stores.items() if s is store)
        await store.update_topic(TopicConfig("T", read_queue_nums=2, write_queue_nums=2))
        await store.put_messages([message("T", b"committed-%d" % i, queue_id=i % 2) for i in range(20)])
        await cluster.wait_applied()
        for follower in [n for n in cluster.stores if n != leader]:
            await cluster.stop(follower)
        with pytest.raises(StoreError):  # no quorum: written locally, never committed
            await store.put_messages([message("T", b"uncommitted-%d" % i) for i in range(5)])
        await cluster.stop()
        return leader

    leader = asyncio.run(leave_uncommitted_entries())
    node_dir = tmp_path / leader
    checkpoint = read_properties(str(node_dir / f"dledger-{leader}" / "checkpoint"))
    committed, end = int(checkpoint["committedIndex"]), int(checkpoint["endIndex"])
    assert end >= committed + 5  # the uncommitted entries are on disk
    assert LogFiles.locate(str(node_dir)).index_record(end) is not None

    rows = spark_session.read.format("dledger").load(str(node_dir)).collect()

    assert max(row["index"] for row in rows) <= committed
    bodies = sorted(row["body"] for row in rows if row["kind"] == "message")
    assert bodies == sorted(b"committed-%d" % i for i in range(20))


def test_replay_summarizes_queues_computes_lag_and_the_check_passes(spark_session, workload, tmp_path):
    base, expected = workload
    result = run_replay(spark_session, ReplayRequest(out_dir=str(tmp_path), data_dir=os.path.join(base, "n1")))

    summary = result.summary
    assert summary["check"] == "ok", summary["check"]
    assert summary["messages"] == 127 and summary["entries"] > 127
    assert summary["committed_index"] == int(read_properties(
        os.path.join(base, "n1", "dledger-n1", "checkpoint"))["committedIndex"])
    assert {topic: {int(q): v["messages"] for q, v in info["queues"].items()}
            for topic, info in summary["topics"].items()} == expected
    assert summary["topics"]["Orders"]["queues"]["2"] == {"messages": 40, "max_offset": 40}
    assert summary["topics"]["Orders"]["messages"] == 120
    lag = {(r["group"], r["topic"], r["queue_id"]): (r["offset"], r["lag"]) for r in result.consumer_lag}
    assert lag == {("billing", "Orders", 0): (10, 30), ("billing", "Orders", 1): (12, 28),
                   ("audit-reader", "Audit", 0): (5, 2), ("gone", "Audit", 0): (1, 6)}
    orders = spark_session.read.parquet(str(tmp_path / "log" / "topic=Orders"))
    assert orders.count() == 120
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_the_check_names_the_queue_whose_consume_queue_was_tampered_with(spark_session, workload, tmp_path):
    base, _ = workload
    node = tmp_path / "n2"
    shutil.copytree(os.path.join(base, "n2"), node)
    queue_dir = node / "store" / "consumequeue" / "Orders" / "1"
    first_file = sorted(queue_dir.iterdir())[0]
    with open(first_file, "r+b") as f:  # unit 5: a different message size
        f.seek(5 * 20 + 8)
        size = struct.unpack(">i", f.read(4))[0]
        f.seek(5 * 20 + 8)
        f.write(struct.pack(">i", size + 1))

    result = run_replay(spark_session, ReplayRequest(out_dir=str(tmp_path / "out"), data_dir=str(node)))

    assert not result.ok
    [mismatch] = result.summary["check"]
    assert mismatch["queue"] == "Orders/1"
    assert mismatch["first_differences"][0]["queue_offset"] == 5
    assert mismatch["first_differences"][0]["consume_queue"]["size"] == \
        mismatch["first_differences"][0]["replay"]["size"] + 1


def test_the_replay_command_runs_on_executors_in_separate_processes(workload, tmp_path):
    base, expected = workload
    command = [sys.executable, "-m", "cluster.cli", "replay", "--data-dir", os.path.join(base, "n0"),
               "--out", str(tmp_path / "out"), "--json", "--master", "local-cluster[2,1,1024]",
               # Executor JVMs that start quicker: this job is tiny.
               "--conf", f"spark.executor.extraJavaOptions={QUICK_START_JAVA_OPTIONS}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})

    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 executor JVM(s) besides the driver" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["check"] == "ok" and summary["messages"] == 127
    assert {topic: {int(q): v["messages"] for q, v in info["queues"].items()}
            for topic, info in summary["topics"].items()} == expected


def test_a_bare_copy_of_data_segments_reads_the_same_rows_up_to_a_given_end(spark_session, workload, tmp_path):
    base, _ = workload
    node = os.path.join(base, "n0")
    committed = int(read_properties(os.path.join(node, "dledger-n0", "checkpoint"))["committedIndex"])
    copy = tmp_path / "segments"
    shutil.copytree(os.path.join(node, "dledger-n0", "data"), copy)  # no index files, no checkpoint

    def rows(path: str, **options: str) -> list:  # noqa: ANN401
        df = spark_session.read.format("dledger").options(**options).load(path)
        return [tuple(r) for r in df.select("index", "kind", "topic", "queue_offset", "body").orderBy("index").collect()]

    middle = committed // 2
    assert rows(str(copy), endIndex=str(committed)) == rows(node)
    assert rows(str(copy), startIndex=str(middle), endIndex=str(committed)) == \
        rows(node, startIndex=str(middle))
    with pytest.raises(Exception, match="endIndex"):
        rows(str(copy))


def test_offsets_come_from_the_latest_snapshot_and_the_commits_after_it(spark_session):
    from spark.consumer_lag import committed_offsets

    def system(index: int, kind: str, payload: dict) -> tuple:
        return index, "system", kind, json.dumps(payload).encode()

    entries = spark_session.createDataFrame([
        system(1, "CONSUMER_OFFSETS", {"offsets": [["g", "T", 0, 3], ["old", "T", 1, 9]]}),
        system(2, "METADATA_SNAPSHOT", {"managers": {"consumerOffset.json": {"offsetTable": {
            "T@g": {"0": 4}, "T@h": {"1": 7}}}, "topics.json": {"topicConfigTable": {}}}}),
        system(3, "CONSUMER_OFFSETS", {"offsets": [["h", "T", 1, 8]]}),
    ], "index long, kind string, system_kind string, body binary")

    offsets = {(r["group"], r["topic"], r["queue_id"]): r["offset"] for r in committed_offsets(entries).collect()}

    # "old" was committed before the snapshot and is not in it: the snapshot replaced the table.
    assert offsets == {("g", "T", 0): 4, ("h", "T", 1): 8}


def test_commits_after_a_snapshots_as_of_count_even_when_it_lands_after_them(spark_session):
    from spark.consumer_lag import committed_offsets

    def system(index: int, kind: str, payload: dict) -> tuple:
        return index, "system", kind, json.dumps(payload).encode()

    # The snapshot at 4 holds the table as of entry 2; the commit at 3 landed
    # while it was encoded and is not in it, but counts (as on a replica).
    entries = spark_session.createDataFrame([
        system(1, "CONSUMER_OFFSETS", {"offsets": [["g", "T", 0, 3], ["old", "T", 1, 9]]}),
        system(3, "CONSUMER_OFFSETS", {"offsets": [["g", "T", 0, 6]]}),
        system(4, "METADATA_SNAPSHOT", {"asOf": 2, "managers": {"consumerOffset.json": {"offsetTable": {
            "T@g": {"0": 4}}}}}),
        system(5, "CONSUMER_OFFSETS", {"offsets": [["h", "T", 1, 8]]}),
    ], "index long, kind string, system_kind string, body binary")

    offsets = {(r["group"], r["topic"], r["queue_id"]): r["offset"] for r in committed_offsets(entries).collect()}

    assert offsets == {("g", "T", 0): 6, ("h", "T", 1): 8}
