"""Consumer lag per group, from the offsets the broker replicated through the log.

A CONSUMER_OFFSETS system entry carries [[group, topic, queue id, offset], ...]
(store/consumer_offset.py); a commit sets the offset, so the latest commit by
log index wins, as when the broker applies them. Lag is RocketMQ's: the
queue's max offset (one past its last message) minus the group's offset (the
next message it will consume).
"""
from __future__ import annotations

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


def consumer_lag(entries: DataFrame, queues: DataFrame) -> DataFrame:
    """(group, topic, queue_id, offset, max_offset, lag), one row per committed offset."""
    offsets = committed_offsets(entries)
    return (offsets.join(queues.select("topic", "queue_id", "max_offset"), ["topic", "queue_id"], "left")
            .withColumn("max_offset", F.coalesce(F.col("max_offset"), F.lit(0)))
            .withColumn("lag", F.greatest(F.col("max_offset") - F.col("offset"), F.lit(0)))
            .select("group", "topic", "queue_id", "offset", "max_offset", "lag")
            .orderBy("group", "topic", "queue_id"))
