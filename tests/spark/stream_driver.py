"""A streaming driver for the exactly-once test (test_stream_exactly_once.py):
the two queries it runs, and a process that runs them until it is killed.

    python -m tests.spark.stream_driver SERVERS TOPIC COPY_TOPIC WORK_DIR

starts a local SparkSession, starts both queries on WORK_DIR's checkpoints,
prints "ready" and then watches them: a query that fails makes the process
print its error and exit 1, so the test sees a failure even in a driver it
SIGKILLs later. It exits 2 by itself after MAX_LIFETIME_S (a bounded run).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

TRIGGER = "0.5 seconds"
MAX_ENTRIES_PER_TRIGGER = 400
MAX_LIFETIME_S = 300.0
FIRST_BATCH_TIMEOUT_S = 60.0
# Columns the Parquet sink keeps: enough to check indexes, queue order and bodies.
COLUMNS = ("index", "topic", "queue_id", "queue_offset", "message_id", "body")


def start_queries(spark: Any, servers: str, topic: str, copy_topic: str, work_dir: Path) -> list[Any]:
    """The live source into the Parquet file sink, and into the dledger sink
    feeding `copy_topic`, each on its own checkpoint under `work_dir`."""
    def source() -> Any:
        # Bounded micro-batches: more of them, and a replayed one is a fixed range.
        return spark.readStream.format("dledger").option("servers", servers).option("topic", topic) \
            .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", str(MAX_ENTRIES_PER_TRIGGER)) \
            .load()

    to_parquet = source().select(*COLUMNS).writeStream.format("parquet") \
        .option("path", str(work_dir / "out")).option("checkpointLocation", str(work_dir / "ck-parquet")) \
        .queryName("to_parquet").trigger(processingTime=TRIGGER).start()
    await_first_batch(to_parquet)
    to_topic = source().selectExpr("body", "'copied' AS tags").writeStream.format("dledger") \
        .option("servers", servers).option("topic", copy_topic) \
        .option("checkpointLocation", str(work_dir / "ck-topic")) \
        .queryName("to_topic").trigger(processingTime=TRIGGER).start()
    return [to_parquet, to_topic]


def await_first_batch(query: Any, timeout_s: float = FIRST_BATCH_TIMEOUT_S) -> None:
    """Until `query` has run a micro-batch (or failed, or `timeout_s` passed).
    Spark's Python runners add keys to their function's environment map
    (`envVars.put`) the first time they run, in the same JVM where the driver
    may be serializing another query's tasks that hold that map: two queries
    started together in one driver can then fail with
    java.io.OptionalDataException (a race in Spark itself, seen once in
    `make test`). Once one query has run, the keys are there and later runs
    only replace values with equal ones."""
    deadline = time.monotonic() + timeout_s
    while query.lastProgress is None and query.isActive and query.exception() is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)


def committed_batches(work_dir: Path) -> dict[str, int]:
    """Micro-batches each query has committed so far (its checkpoint's commit log)."""
    def count(checkpoint: Path) -> int:
        commits = checkpoint / "commits"
        return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0
    return {name: count(work_dir / name) for name in ("ck-parquet", "ck-topic")}


def failures(queries: list[Any]) -> list[str]:
    return [f"{q.name}: {q.exception()}" for q in queries if q.exception() is not None or not q.isActive]


def main(servers: str, topic: str, copy_topic: str, work_dir: str) -> int:
    from spark.session import build_session

    spark = build_session("local[2]", app_name="exactly-once-driver", quick_start=True,
                          extra={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    queries = start_queries(spark, servers, topic, copy_topic, Path(work_dir))
    print("ready", flush=True)
    deadline = time.monotonic() + MAX_LIFETIME_S
    while time.monotonic() < deadline:
        failed = failures(queries)
        if failed:
            print("failed: " + " | ".join(failed), flush=True)
            return 1
        time.sleep(0.2)
    return 2


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
