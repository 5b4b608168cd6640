"""`dledger replay`: the CLI side of the replay job (cluster/cli.py imports
this only when the command runs, so other commands never load Spark)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark.replay import ReplayResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", metavar="DIR",
                        help="a node's data dir (read only; the node may be running)")
    source.add_argument("--servers", metavar="HOST:PORT[,...]", help="read a running group over gRPC")
    source.add_argument("--groups", metavar="NAME=DIR,...",
                        help="several broker groups: one node's data dir per group; each is replayed and checked "
                             "(OUT/<NAME>/), the summary sums them up")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the Parquet output and summary go")
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")
    parser.add_argument("--master", metavar="URL", help="Spark master (default: local[2])")
    parser.add_argument("--group", default="default", help="DLedger group with --servers")
    parser.add_argument("--node-id", metavar="ID", help="which dledger-<ID>/ when the data dir holds several")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, as spark-submit's --conf (repeatable)")


def run_command(args: argparse.Namespace) -> int:
    # Spark loads only here: argument parsing for every other command stays fast.
    from dledger.client import parse_servers
    from spark.groups import parse_group_dirs, run_group_replay
    from spark.replay import ReplayRequest, run_replay
    from spark.session import build_session

    try:
        group_dirs = parse_group_dirs(args.groups) if args.groups else None
    except ValueError as error:
        print(f"dledger replay: error: {error}", file=sys.stderr)
        return 2

    request = ReplayRequest(out_dir=args.out, data_dir=args.data_dir,
                            servers=tuple(parse_servers(args.servers)) if args.servers else (),
                            group=args.group, node_id=args.node_id)
    settings = dict(item.split("=", 1) for item in args.conf if "=" in item)
    if len(settings) != len(args.conf):
        print("dledger replay: error: --conf takes KEY=VALUE", file=sys.stderr)
        return 2
    started = time.monotonic()
    spark = build_session(args.master, extra=settings)
    try:
        os.makedirs(args.out, exist_ok=True)
        result = run_group_replay(spark, args.out, group_dirs) if group_dirs else run_replay(spark, request)
        # stderr, so that --json output stays the summary alone.
        print(f"dledger replay: master {spark.sparkContext.master}, {_executor_count(spark)} executor JVM(s) "
              f"besides the driver", file=sys.stderr)
    finally:
        spark.stop()
    if not args.json:
        _print_report(result, time.monotonic() - started)
    print(json.dumps(result.summary, separators=(", ", ": "), default=str), flush=True)
    if not result.ok:
        print(f"dledger replay: check failed: {len(result.summary['check'])} mismatch(es)", file=sys.stderr)
        return 1
    return 0


def _executor_count(spark: "SparkSession") -> int:
    """Executors registered with the driver (local mode runs tasks in the driver: 0)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # driver included
    return max(0, len(infos) - 1)


def _print_report(result: "ReplayResult", seconds: float) -> None:
    summary = result.summary
    if "groups" in summary:
        print(f"replayed {len(summary['groups'])} broker groups ({summary['messages']} messages) "
              f"in {seconds:.1f} s")
        for name, group in sorted(summary["groups"].items()):
            print(f" group {name}: {group['messages']} messages up to index {group['committed_index']}, "
                  f"check {'ok' if group['check'] == 'ok' else 'FAILED'}")
        return
    print(f"replayed {summary['entries']} committed entries ({summary['messages']} messages) up to index "
          f"{summary['committed_index']} in {seconds:.1f} s")
    for topic, info in sorted(summary["topics"].items()):
        for queue_id, queue in sorted(info["queues"].items(), key=lambda item: int(item[0])):
            print(f"  {topic}/{queue_id}: {queue['messages']} messages, max offset {queue['max_offset']}")
    for row in result.consumer_lag:
        print(_lag_line(row))


def _lag_line(row: dict[str, Any]) -> str:
    return (f"  group {row['group']} on {row['topic']}/{row['queue_id']}: offset {row['offset']} of "
            f"{row['max_offset']}, lag {row['lag']}")
