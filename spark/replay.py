"""The replay job (`dledger replay`): rebuild per-queue state from the committed
log with Spark, write it as Parquet and check it against the broker's.

    dledger replay (--data-dir DIR | --servers H:P,...) --out DIR [--json] [--master URL]

1. Pin the range: the committed index is read once (the node's checkpoint,
   or the leader), and every pass reads exactly [begin, committed].
2. One pass over the log writes every committed entry to OUT/log, Parquet
   partitioned by topic (system and raw entries, which have none, land in
   topic=__HIVE_DEFAULT_PARTITION__). Later steps read that Parquet, not the log.
3. One aggregation gives, per topic and queue, messages and offsets
   (OUT/queues.json); one more the consumer lag per group from the
   replicated offsets (OUT/consumer_lag.json).
4. The check: queue offsets are dense, nothing above the committed index was
   read, and, given a data dir with the broker's store, the ConsumeQueues
   agree with the replay (spark/queue_check.py).
5. The summary (OUT/summary.json, and printed last by the CLI):
   {"committed_index", "entries", "messages",
    "topics": {TOPIC: {"messages", "queues": {QUEUE_ID: {"messages", "max_offset"}}}},
    "check": "ok" | [mismatch, ...]}
   max_offset is RocketMQ's: one past the queue's last message offset.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.consumer_lag import consumer_lag
from spark.log_source import committed_log
from spark.options import SourceOptions
from spark.queue_check import check_consume_queues


@dataclass(frozen=True)
class ReplayRequest:
    out_dir: str
    data_dir: str | None = None
    servers: tuple[str, ...] = ()
    group: str = "default"
    node_id: str | None = None


@dataclass
class ReplayResult:
    summary: dict[str, Any]
    consumer_lag: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.summary["check"] == "ok"


def source_options(request: ReplayRequest) -> dict[str, str]:
    options = {"group": request.group}
    if request.servers:
        options["servers"] = ",".join(request.servers)
    if request.data_dir:
        options["path"] = request.data_dir
    if request.node_id:
        options["nodeId"] = request.node_id
    return options


def run_replay(spark: SparkSession, request: ReplayRequest) -> ReplayResult:
    options = source_options(request)
    begin, committed = committed_log(SourceOptions.parse(options)).bounds()
    pinned = {**options, "startIndex": str(begin), "endIndex": str(committed)}
    log_dir = os.path.join(request.out_dir, "log")
    # The one pass over the log; every later step reads this Parquet.
    spark.read.format("dledger").options(**pinned).load() \
        .write.mode("overwrite").partitionBy("topic").parquet(log_dir)
    entries = spark.read.parquet(log_dir)
    groups = [row.asDict() for row in _per_queue(entries).collect()]
    queue_rows = sorted((g for g in groups if g["kind"] == "message"), key=lambda g: (g["topic"], g["queue_id"]))
    lag_rows = consumer_lag(entries, {(q["topic"], q["queue_id"]): q["max_offset"] for q in queue_rows})
    max_index = max((g["max_index"] for g in groups), default=None)
    mismatches = _offset_mismatches(queue_rows) + _commit_mismatches(max_index, committed)
    low = min((g["low"] for g in queue_rows), default=None)
    if request.data_dir and low is not None and _has_consume_queues(request.data_dir):
        high = max(g["high"] for g in groups)
        messages = entries.where(F.col("kind") == "message")
        mismatches += check_consume_queues(spark, messages, request.data_dir, low, high)
    summary = {
        "committed_index": committed,
        "entries": sum(g["entries"] for g in groups),
        "messages": sum(q["entries"] for q in queue_rows),
        "topics": _topics(queue_rows),
        "check": mismatches or "ok",
    }
    _write_json(os.path.join(request.out_dir, "summary.json"), summary)
    _write_json(os.path.join(request.out_dir, "queues.json"), [_queue_json(q) for q in queue_rows])
    _write_json(os.path.join(request.out_dir, "consumer_lag.json"), lag_rows)
    return ReplayResult(summary, lag_rows)


def _per_queue(entries: DataFrame) -> DataFrame:
    """Everything the summary and the checks need, in one aggregation: per
    (kind, topic, queue) the count, offsets and the log range it spans."""
    return entries.groupBy("kind", "topic", "queue_id").agg(
        F.count(F.lit(1)).alias("entries"),
        F.countDistinct("queue_offset").alias("distinct_offsets"),
        F.min("queue_offset").alias("min_offset"),
        (F.max("queue_offset") + 1).alias("max_offset"),
        F.max("index").alias("max_index"),
        F.min("physical_offset").alias("low"),
        F.max(F.col("physical_offset") + F.col("store_size")).alias("high"))


def _queue_json(q: dict[str, Any]) -> dict[str, Any]:
    return {"topic": q["topic"], "queue_id": q["queue_id"], "messages": q["entries"],
            "min_offset": q["min_offset"], "max_offset": q["max_offset"]}


def _offset_mismatches(queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A queue's offsets must be dense: each once, none missing in between."""
    found: list[dict[str, Any]] = []
    for q in queues:
        span = q["max_offset"] - q["min_offset"]
        if q["distinct_offsets"] != q["entries"] or span != q["entries"]:
            found.append({"queue": f"{q['topic']}/{q['queue_id']}", "topic": q["topic"], "queue_id": q["queue_id"],
                          "problem": f"queue offsets are not dense: {q['entries']} messages, "
                                     f"{q['distinct_offsets']} distinct offsets in [{q['min_offset']}, "
                                     f"{q['max_offset']})"})
    return found


def _commit_mismatches(max_index: int | None, committed: int) -> list[dict[str, Any]]:
    if max_index is not None and max_index > committed:
        return [{"problem": f"entry {max_index} was read but only entries up to {committed} are committed"}]
    return []


def _has_consume_queues(data_dir: str) -> bool:
    return os.path.isdir(os.path.join(data_dir, "store", "consumequeue"))


def _topics(queues: list[dict[str, Any]]) -> dict[str, Any]:
    topics: dict[str, Any] = {}
    for q in queues:
        topic = topics.setdefault(q["topic"], {"messages": 0, "queues": {}})
        topic["messages"] += q["entries"]
        topic["queues"][str(q["queue_id"])] = {"messages": q["entries"], "max_offset": q["max_offset"]}
    return topics


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2, default=str)
        f.write("\n")
    os.replace(path + ".tmp", path)
