"""The `dledger` sink's throughput against the broker's batched send rate from
our client (`bench send`'s batched mode), in the same run, same cluster.

    python -m bench.sink [--servers H:P,...] [--rows 100000] [--size 1024] [--duration 5] [--runs 2]

Without --servers it starts its own three-node cluster (the default node
files, as `bench send` does). Each run, interleaved:

    send        broker.client, 16 concurrent send_batch of 64 (`bench send` batched)
    sink_task   the sink's own path without Spark: one task's rows -> messages
                -> the producer (spark/sink.py _Writer), in this process
    sink_spark  df.write.format("dledger") from local[2], 2 partitions of
                --rows 1 KiB rows (spark.range, so making the rows is nearly free)
    sink_spark_steady
                the same with twice the rows right after: rows / (the longer job's time
                - the shorter's), the rate once a job's fixed cost (scheduling, Python
                workers, the producer's start) is paid, as `bench send`'s warm producer
                has paid it before its clock starts

One JSON line per measurement with messages/s and CPU per message (each
node, and the client: this process, or Spark's JVM with its Python workers),
then a summary with the best of each and the ratios sink / send.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.proc_cpu import CpuMeter
from bench.replay import process_tree_cpu_seconds
from cluster.broker_bench import bench_send, ensure_topic
from cluster.process_cluster import DEFAULT_NODE_FILES, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from spark.live_log import _LoopThread

SEND_INFLIGHT, SEND_BATCH = 16, 64  # `python -m bench.send`'s batched mode (--inflight 64 --batch 64)


def emit(line: dict[str, Any]) -> dict[str, Any]:
    line["load_avg_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(line), flush=True)
    return line


def measure_send(servers: str, meter: CpuMeter, size: int, duration: float) -> dict[str, Any]:
    meter.start()
    result = _LoopThread.run(bench_send(servers, "BenchSend", size, SEND_INFLIGHT, SEND_BATCH, duration))
    return emit({"bench": "send", "messages": result.messages, "seconds": round(result.duration_s, 2),
                 "messages_per_s": round(result.messages / result.duration_s),
                 "cpu_us_per_message": meter.per_message(result.messages), "errors": sum(result.errors.values()),
                 "note": f"broker.client, {SEND_INFLIGHT} concurrent send_batch of {SEND_BATCH}"})


def measure_sink_task(servers: str, meter: CpuMeter, rows: int, size: int) -> dict[str, Any]:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from spark.sink import SinkOptions, _Writer

    options = SinkOptions.parse({"servers": servers, "topic": "BenchSink"},
                                StructType([StructField("body", BinaryType())]))
    body = os.urandom(size)
    data = [{"body": body}] * rows
    meter.start()
    started = time.monotonic()
    commit = _Writer(options).write_rows(iter(data), uuid.uuid4().hex, 0, 0)
    seconds = time.monotonic() - started
    assert commit.sent == rows, commit
    return emit({"bench": "sink_task", "messages": rows, "seconds": round(seconds, 2),
                 "messages_per_s": round(rows / seconds), "cpu_us_per_message": meter.per_message(rows),
                 "note": "spark/sink.py's writer on one partition's rows, without Spark"})


def measure_sink_spark(spark: Any, servers: str, meter: CpuMeter, rows: int, size: int) -> dict[str, Any]:
    df = spark.range(0, rows, 1, 2).selectExpr(f"cast(repeat('x', {size}) AS binary) AS body")
    jvm = spark.sparkContext._gateway.proc.pid
    meter.start()
    cpu = process_tree_cpu_seconds(jvm)
    started = time.monotonic()
    df.write.format("dledger").mode("append").option("servers", servers).option("topic", "BenchSink").save()
    seconds = time.monotonic() - started
    spark_cpu = process_tree_cpu_seconds(jvm) - cpu
    return emit({"bench": "sink_spark", "messages": rows, "seconds": round(seconds, 2),
                 "messages_per_s": round(rows / seconds),
                 "cpu_us_per_message": meter.per_message(rows, spark_cpu, "spark"),
                 "note": "df.write.format('dledger'), local[2], 2 partitions; spark = its JVM and Python workers"})


def run(servers: str, node_pids: dict[str, int], args: argparse.Namespace) -> None:
    from spark.session import build_session

    meter = CpuMeter(node_pids)
    _LoopThread.run(ensure_topic(servers, "BenchSink"))
    spark = build_session("local[2]", app_name="bench-sink")
    try:
        measure_sink_spark(spark, servers, meter, 2000, args.size)  # warm: Python workers, producer, topic
        results: dict[str, list[dict[str, Any]]] = {"send": [], "sink_task": [], "sink_spark": [],
                                                     "sink_spark_steady": []}
        for _ in range(args.runs):
            results["send"].append(measure_send(servers, meter, args.size, args.duration))
            results["sink_task"].append(measure_sink_task(servers, meter, args.rows, args.size))
            short = measure_sink_spark(spark, servers, meter, args.rows, args.size)
            long = measure_sink_spark(spark, servers, meter, 2 * args.rows, args.size)
            results["sink_spark"].append(short)
            extra_s = long["seconds"] - short["seconds"]
            results["sink_spark_steady"].append(emit({
                "bench": "sink_spark_steady", "messages": args.rows, "seconds": round(extra_s, 2),
                "messages_per_s": round(args.rows / extra_s) if extra_s > 0 else 0,
                "note": f"{args.rows} rows / (the {2 * args.rows}-row job's time - the {args.rows}-row job's)"}))
    finally:
        spark.stop()
    best = {name: max(r["messages_per_s"] for r in runs) for name, runs in results.items()}
    emit({"summary": True, **{f"{name}_messages_per_s": rate for name, rate in best.items()},
          **{f"{name}_vs_send": round(best[name] / best["send"], 2)
             for name in ("sink_task", "sink_spark", "sink_spark_steady")}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", help="a running cluster (default: start one)")
    # A 20,000-row job is mostly Spark's fixed cost per job at these rates.
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each send run")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    if args.servers:
        run(args.servers, {}, args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as base:
        cluster = ProcessCluster(Path(base), extra_args=DEFAULT_NODE_FILES)
        cluster.start()
        try:
            addresses = list(cluster.addresses.values())

            async def leader() -> str:
                async with DLedgerClient(addresses) as client:
                    return await find_leader(client, addresses, timeout=60.0)
            _LoopThread.run(leader())
            run(",".join(addresses), {n: p.pid for n, p in cluster.procs.items()}, args)
        finally:
            cluster.stop_all()


if __name__ == "__main__":
    main()
