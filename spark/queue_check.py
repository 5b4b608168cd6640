"""The replay's consistency check against the broker's ConsumeQueues.

The broker derives one ConsumeQueue unit (commit log offset, size, tag hash)
per dispatched message from committed entries. The replay derives the same
units from the same entries. Per queue both sides are summarized (count,
first and last offset, a CRC digest of the units), the summaries compared,
and for a queue that differs the first differing queue offset is found with
a join, so a mismatch names the queue and the place.

Only the part of each queue both sides can speak for is compared: units whose
commit log offset lies inside the replayed range. Below it retention deleted
the log (the queue keeps files until all their units expire); above it a
running node's apply loop may be ahead of the committedIndex its checkpoint
recorded a few seconds ago.
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from store import message_const as mc

UNIT_COLUMNS = ("topic", "queue_id", "queue_offset", "physical_offset", "size", "tags_code")
# RocketMQ dispatches plain and committed-transaction messages to ConsumeQueues;
# half (prepared) and rolled-back ones stay out (CommitLogDispatcherBuildConsumeQueue).
_DISPATCHED_TYPES = (mc.TRANSACTION_NOT_TYPE, mc.TRANSACTION_COMMIT_TYPE)
# How many differing queue offsets a mismatch lists.
SHOWN_DIFFERENCES = 5


def replayed_units(messages: DataFrame) -> DataFrame:
    dispatched = F.col("sys_flag").bitwiseAND(mc.TRANSACTION_TYPE_MASK).isin(*_DISPATCHED_TYPES)
    return messages.where(dispatched).select(
        "topic", "queue_id", "queue_offset", "physical_offset", F.col("store_size").alias("size"), "tags_code")


def _summaries(units: DataFrame) -> DataFrame:
    unit_crc = F.crc32(F.concat_ws(":", *[F.col(c).cast("string") for c in UNIT_COLUMNS[2:]]))
    return units.groupBy("topic", "queue_id").agg(
        F.count(F.lit(1)).alias("messages"),
        F.min("queue_offset").alias("min_offset"),
        F.max("queue_offset").alias("max_offset"),
        # A sum of per-unit CRCs that include the queue offset: a positional
        # digest, computed in parallel without ordering the units.
        (F.sum(unit_crc) % (1 << 32)).alias("crc"))


def check_consume_queues(spark: SparkSession, messages: DataFrame, node_dir: str,
                         low_physical_offset: int, high_physical_offset: int) -> list[dict[str, Any]]:
    """Mismatches between replayed and stored units ([] when they agree)."""
    in_range = F.col("physical_offset").between(low_physical_offset, high_physical_offset)
    replay = replayed_units(messages).where(in_range).cache()
    stored = spark.read.format("dledger_consumequeue").load(node_dir).where(in_range).cache()
    try:
        keys = ["topic", "queue_id"]
        left = _summaries(replay).alias("r")
        right = _summaries(stored).alias("c")
        compared = left.join(right, keys, "full_outer").select(
            *keys, *[F.col(f"r.{c}").alias(f"r_{c}") for c in ("messages", "min_offset", "max_offset", "crc")],
            *[F.col(f"c.{c}").alias(f"c_{c}") for c in ("messages", "min_offset", "max_offset", "crc")])
        agree = F.lit(True)
        for c in ("messages", "min_offset", "max_offset", "crc"):
            agree = agree & F.col(f"r_{c}").eqNullSafe(F.col(f"c_{c}"))
        differing = [row.asDict() for row in compared.where(~agree).orderBy(*keys).collect()]
        return [_mismatch(row, _first_differences(replay, stored, row["topic"], row["queue_id"]))
                for row in differing]
    finally:
        replay.unpersist()
        stored.unpersist()


def _first_differences(replay: DataFrame, stored: DataFrame, topic: str, queue_id: int) -> list[dict[str, Any]]:
    queue = (F.col("topic") == topic) & (F.col("queue_id") == queue_id)
    fields = UNIT_COLUMNS[3:]
    left = replay.where(queue).select("queue_offset", *[F.col(c).alias(f"r_{c}") for c in fields])
    right = stored.where(queue).select("queue_offset", *[F.col(c).alias(f"c_{c}") for c in fields])
    same = F.lit(True)
    for c in fields:
        same = same & F.col(f"r_{c}").eqNullSafe(F.col(f"c_{c}"))
    rows = left.join(right, "queue_offset", "full_outer").where(~same).orderBy("queue_offset") \
        .limit(SHOWN_DIFFERENCES).collect()
    return [{"queue_offset": row["queue_offset"],
             "replay": _unit(row, "r_"), "consume_queue": _unit(row, "c_")} for row in rows]


def _unit(row: Any, prefix: str) -> dict[str, int] | None:
    if row[f"{prefix}physical_offset"] is None:
        return None
    return {"physical_offset": row[f"{prefix}physical_offset"], "size": row[f"{prefix}size"],
            "tags_code": row[f"{prefix}tags_code"]}


def _mismatch(row: dict[str, Any], differences: list[dict[str, Any]]) -> dict[str, Any]:
    def side(prefix: str) -> dict[str, Any] | None:
        if row[f"{prefix}messages"] is None:
            return None
        return {"messages": row[f"{prefix}messages"], "min_offset": row[f"{prefix}min_offset"],
                "max_offset": row[f"{prefix}max_offset"], "crc": row[f"{prefix}crc"]}

    replay, stored = side("r_"), side("c_")
    if stored is None:
        problem = "the broker has no ConsumeQueue units for this queue"
    elif replay is None:
        problem = "the ConsumeQueue holds units that no committed message accounts for"
    elif replay["messages"] != stored["messages"]:
        problem = f"{replay['messages']} messages replayed, {stored['messages']} units in the ConsumeQueue"
    else:
        problem = "the ConsumeQueue's units differ from the replayed messages"
    return {"queue": f"{row['topic']}/{row['queue_id']}", "topic": row["topic"], "queue_id": row["queue_id"],
            "problem": problem, "replay": replay, "consume_queue": stored, "first_differences": differences}
