"""Several broker groups in one DataFrame, and the replay of each.

Each broker group is its own DLedger group with its own log, so there is no
one log to read: every group is read through the `dledger` source as it is
(a node's data dir, or live servers of that group) and the results are
unioned with the group's name as the `broker_name` column, the way a
RocketMQ message is known by its broker and queue. The replay runs once per
group (each group's queues, offsets and ConsumeQueues are its own) and
sums up.

    read_groups(spark, {"g0": {"path": "./data/g0n0"}, "g1": {"path": "./data/g1n0"}})
    dledger replay --groups g0=./data/g0n0,g1=./data/g1n0 --out ./replay
"""
from __future__ import annotations

import json
import os
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.replay import ReplayRequest, ReplayResult, run_replay

BROKER_NAME = "broker_name"


def parse_group_dirs(text: str) -> dict[str, str]:
    """"g0=DIR,g1=DIR" -> {"g0": "DIR", "g1": "DIR"} (ValueError on bad input)."""
    groups: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--groups item {item!r}: expected NAME=DIR")
        if name in groups:
            raise ValueError(f"--groups names {name!r} twice")
        groups[name] = path
    if not groups:
        raise ValueError("--groups names no group")
    return groups


def read_groups(spark: SparkSession, sources: dict[str, dict[str, str]]) -> DataFrame:
    """Every group's committed entries, each row with its group's name."""
    frames = []
    for name, options in sorted(sources.items()):
        options = dict(options)
        path = options.pop("path", None)
        reader = spark.read.format("dledger").options(**options)
        frame = reader.load(path) if path else reader.load()
        frames.append(frame.withColumn(BROKER_NAME, F.lit(name)))
    return reduce(lambda a, b: a.unionByName(b), frames)


def run_group_replay(spark: SparkSession, out_dir: str, group_dirs: dict[str, str]) -> ReplayResult:
    """Replay each group's data dir into OUT/<group>/ and sum up:
    {"groups": {name: that group's summary}, "messages", "entries",
     "check": "ok" | [mismatch with its "group", ...]}."""
    summaries: dict[str, Any] = {}
    lag: list[dict[str, Any]] = []
    mismatches: list[dict[str, Any]] = []
    for name, data_dir in sorted(group_dirs.items()):
        result = run_replay(spark, ReplayRequest(out_dir=os.path.join(out_dir, name), data_dir=data_dir))
        summaries[name] = result.summary
        lag += [{**row, BROKER_NAME: name} for row in result.consumer_lag]
        if not result.ok:
            mismatches += [{**m, BROKER_NAME: name} for m in result.summary["check"]]
    summary = {"groups": summaries, "entries": sum(s["entries"] for s in summaries.values()),
               "messages": sum(s["messages"] for s in summaries.values()), "check": mismatches or "ok"}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
        f.write("\n")
    return ReplayResult(summary, lag)
