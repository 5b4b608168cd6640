"""Consumer lag per group, from the offsets the broker replicated through the log.

A CONSUMER_OFFSETS system entry carries [[group, topic, queue id, offset], ...]
(store/consumer_offset.py); a commit sets the offset, so the latest commit by
log index wins, as when the broker applies them. A METADATA_SNAPSHOT entry
carries the whole offset table as of the entry its asOf names (older ones:
the entry before it) and replaces it, so offsets whose commits retention
deleted are still known; commits after asOf count on top of it. Lag is
RocketMQ's: the queue's max offset (one past its last message) minus the
group's offset (the next message it will consume).
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from store.consumer_offset import TOPIC_GROUP_SEPARATOR
from store.system_entry import SystemKind

_COMMITS = "struct<offsets: array<array<string>>>"
# consumerOffset.json inside a METADATA_SNAPSHOT: {"topic@group": {"queue id": offset}}.
_SNAPSHOT = ("struct<asOf: bigint, managers: struct<`consumerOffset.json`: "
             "struct<offsetTable: map<string, map<string, bigint>>>>>")


def _system(entries: DataFrame, kind: SystemKind) -> DataFrame:
    return entries.where((F.col("kind") == "system") & (F.col("system_kind") == kind.name))


def _commits(entries: DataFrame) -> DataFrame:
    """(index, group, topic, queue_id, offset) of every CONSUMER_OFFSETS commit."""
    return (_system(entries, SystemKind.CONSUMER_OFFSETS)
            .select("index", F.explode(F.from_json(F.col("body").cast("string"), _COMMITS)["offsets"]).alias("c"))
            .select("index", F.col("c")[0].alias("group"), F.col("c")[1].alias("topic"),
                    F.col("c")[2].cast("int").alias("queue_id"), F.col("c")[3].cast("long").alias("offset")))


def _snapshots(entries: DataFrame) -> DataFrame:
    """(index, as_of, table) of every METADATA_SNAPSHOT."""
    snapshot = F.from_json(F.col("body").cast("string"), _SNAPSHOT)
    return _system(entries, SystemKind.METADATA_SNAPSHOT).select(
        "index", F.coalesce(snapshot["asOf"], F.col("index") - 1).alias("as_of"),
        snapshot["managers"]["consumerOffset.json"]["offsetTable"].alias("table"))


def committed_offsets(entries: DataFrame) -> DataFrame:
    """(group, topic, queue_id, offset, index): where each group stands per
    queue, as the broker computes it: the latest METADATA_SNAPSHOT replaces
    the whole table as of its asOf (store/metadata_snapshot.py; its rows
    carry that index), commits after asOf set offsets."""
    snapshots = _snapshots(entries)
    # One row: the latest snapshot's index and asOf (nulls without one).
    latest = snapshots.agg(F.max(F.struct("index", "as_of")).alias("m")) \
        .select(F.col("m.index").alias("latest"), F.col("m.as_of").alias("at"))
    current = (snapshots.join(latest, snapshots["index"] == latest["latest"])
               .select(F.col("as_of").alias("index"), F.explode("table").alias("key", "queues"))
               .select("index", "key", F.explode("queues").alias("queue_id", "offset"))
               .select("index", F.substring_index("key", TOPIC_GROUP_SEPARATOR, -1).alias("group"),
                       F.substring_index("key", TOPIC_GROUP_SEPARATOR, 1).alias("topic"),
                       F.col("queue_id").cast("int").alias("queue_id"), "offset"))
    later = _commits(entries).crossJoin(latest.select("at")) \
        .where(F.col("at").isNull() | (F.col("index") > F.col("at"))).drop("at")
    newest = Window.partitionBy("group", "topic", "queue_id").orderBy(F.col("index").desc())
    return (current.unionByName(later).withColumn("rank", F.row_number().over(newest))
            .where("rank = 1").drop("rank"))


def consumer_lag(entries: DataFrame, max_offsets: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """[{group, topic, queue_id, offset, max_offset, lag}], one per committed
    offset; the queues' max offsets come from the replay (small, on the driver)."""
    rows = committed_offsets(entries).orderBy("group", "topic", "queue_id").collect()
    lag: list[dict[str, Any]] = []
    for row in rows:
        max_offset = max_offsets.get((row["topic"], row["queue_id"]), 0)
        lag.append({"group": row["group"], "topic": row["topic"], "queue_id": row["queue_id"],
                    "offset": row["offset"], "max_offset": max_offset, "lag": max(0, max_offset - row["offset"])})
    return lag
