"""Several broker groups in Spark (spark/groups.py): two groups' logs (each
the files of MessageStores on real DLedgerServers, as in test_replay.py)
read as one DataFrame with the broker name as a column, and the replay of
each group, checked and summed up."""
from __future__ import annotations

import asyncio
import os
import shutil
import struct

import pytest
from pyspark.sql import functions as F

from spark.groups import parse_group_dirs, read_groups, run_group_replay
from tests.spark.test_replay import broker_workload

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name in ("g0", "g1"):
        base = str(tmp_path_factory.mktemp(f"group-{name}"))
        asyncio.run(broker_workload(base))
        dirs[name] = os.path.join(base, "n0")
    return dirs


def test_two_groups_read_as_one_frame_with_the_broker_name(spark_session, two_groups):
    frame = read_groups(spark_session, {name: {"path": path} for name, path in two_groups.items()})
    counts = {(r["broker_name"], r["topic"]): r["count"] for r in
              frame.where(F.col("kind") == "message").groupBy("broker_name", "topic").count().collect()}
    assert counts == {("g0", "Orders"): 120, ("g0", "Audit"): 7, ("g1", "Orders"): 120, ("g1", "Audit"): 7}


def test_each_group_is_replayed_and_checked_and_a_damaged_one_is_named(spark_session, two_groups, tmp_path):
    result = run_group_replay(spark_session, str(tmp_path / "ok"), two_groups)
    assert result.summary["check"] == "ok", result.summary["check"]
    assert result.summary["messages"] == 254
    assert {name: s["topics"]["Orders"]["messages"] for name, s in result.summary["groups"].items()} == \
        {"g0": 120, "g1": 120}
    assert (tmp_path / "ok" / "g1" / "summary.json").exists()

    damaged = dict(two_groups)
    copy = tmp_path / "g1-copy"
    shutil.copytree(two_groups["g1"], copy)
    first_file = sorted((copy / "store" / "consumequeue" / "Orders" / "1").iterdir())[0]
    with open(first_file, "r+b") as f:  # unit 5: a different message size
        f.seek(5 * 20 + 8)
        size = struct.unpack(">i", f.read(4))[0]
        f.seek(5 * 20 + 8)
        f.write(struct.pack(">i", size + 1))
    damaged["g1"] = str(copy)
    result = run_group_replay(spark_session, str(tmp_path / "bad"), damaged)
    assert result.summary["check"] != "ok"
    assert [(m["broker_name"], m["queue"]) for m in result.summary["check"]] == [("g1", "Orders/1")]


def test_group_dirs_are_parsed_with_readable_errors():
    assert parse_group_dirs("g0=/a, g1=/b") == {"g0": "/a", "g1": "/b"}
    for bad, words in (("g0", "NAME=DIR"), ("g0=/a,g0=/b", "twice"), ("", "no group"), ("=/a", "NAME=DIR")):
        with pytest.raises(ValueError, match=words):
            parse_group_dirs(bad)
