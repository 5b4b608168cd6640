"""Consumer lag per group, from the offsets the broker replicated through the log.

A CONSUMER_OFFSETS system entry carries [[group, topic, queue id, offset], ...]
(store/consumer_offset.py); a commit sets the offset, so the latest commit by
log index wins, as when the broker applies them. Lag is RocketMQ's: the
queue's max offset (one past its last message) minus the group's offset (the
next message it will consume).
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from store.system_entry import SystemKind

_PAYLOAD = "struct<offsets: array<array<string>>>"


def committed_offsets(entries: DataFrame) -> DataFrame:
    """(group, topic, queue_id, offset, index): each queue's latest commit per group."""
    commits = (entries.where((F.col("kind") == "system")
                             & (F.col("system_kind") == SystemKind.CONSUMER_OFFSETS.name))
               .select("index", F.explode(F.from_json(F.col("body").cast("string"), _PAYLOAD)["offsets"])
                       .alias("commit"))
               .select("index", F.col("commit")[0].alias("group"), F.col("commit")[1].alias("topic"),
                       F.col("commit")[2].cast("int").alias("queue_id"),
                       F.col("commit")[3].cast("long").alias("offset")))
    latest = Window.partitionBy("group", "topic", "queue_id").orderBy(F.col("index").desc())
    return commits.withColumn("rank", F.row_number().over(latest)).where("rank = 1").drop("rank")


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
