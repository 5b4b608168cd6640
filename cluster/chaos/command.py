"""`dledger chaos`: its arguments, and the run with its exit code.

    dledger chaos [--nodes 3] [--duration SECONDS] [--faults kill,partition,pause,...]
                  [--seed N] [--workload log|broker] [--out DIR] [--no-idempotence] [--secure] [--json]

Prints the summary JSON last (with --json) and exits 0 when every check
passed, 1 when any failed, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.chaos.history import History
from cluster.chaos.schedule import ALIASES, ALL_KINDS, MEMBER_CHANGE, ScheduleConfig, parse_faults
from cluster.chaos.workload import WORKLOADS, LogWorkloadConfig, WorkloadUnavailable, make_workload

if TYPE_CHECKING:
    from cluster.chaos.runner import ChaosOptions

# Node flags passed through unchanged (the timings decide failover times).
NODE_FLAGS = ("--heartbeat-interval", "--election-timeout-min", "--election-timeout-max", "--max-wait-ack",
              "--flush-mode")
DEFAULT_ELECTION_TIMEOUT_MAX_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fault_names = ", ".join(list(ALIASES) + list(ALL_KINDS))
    parser.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                        help="how long the load and the faults go on (default 60)")
    parser.add_argument("--faults", default="all", metavar="KIND,...",
                        help=f"fault kinds or groups, comma separated (default all): {fault_names}")
    parser.add_argument("--seed", type=int, help="replays a schedule (default: a random seed, printed)")
    parser.add_argument("--workload", default="log", choices=WORKLOADS)
    parser.add_argument("--out", default="chaos-out", metavar="DIR",
                        help="summary.json, history.jsonl, timeline.png and node logs go here (default chaos-out)")
    parser.add_argument("--clients", type=int, default=LogWorkloadConfig.clients, help="concurrent clients")
    parser.add_argument("--rate", type=float, default=LogWorkloadConfig.rate_per_client, metavar="OPS",
                        help="appends per second per client outside heavy bursts")
    parser.add_argument("--no-idempotence", action="store_true",
                        help="clients without a producer id: an append with an unknown outcome is not retried")
    parser.add_argument("--no-official", action="store_true",
                        help="broker workload: leave out the official RocketMQ 5 Python client's share")
    parser.add_argument("--no-front-ends", action="store_true",
                        help="broker workload: no front ends (routes then list every node's own port)")
    parser.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs after a valid run")
    parser.add_argument("--secure", action="store_true",
                        help="run the cluster as `cluster up --secure` does: TLS, mutual TLS between peers (through "
                             "the fault proxies), authentication and ACLs; every client signs as admin")
    for flag in NODE_FLAGS:
        parser.add_argument(flag, dest="node_" + flag[2:].replace("-", "_"), metavar="VALUE",
                            help=f"passed to every node as {flag}")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON (last on stdout)")


def options_from(args: argparse.Namespace) -> ChaosOptions:
    """Raises ValueError (or WorkloadUnavailable) on bad arguments."""
    # The runner draws with matplotlib: imported only when a run is asked for,
    # not by every `dledger` command that builds the parser.
    from cluster.chaos.runner import ChaosOptions
    if args.nodes < 1:
        raise ValueError("--nodes must be at least 1")
    if args.duration <= 0:
        raise ValueError("--duration must be positive")
    if args.clients < 1 or args.rate <= 0:
        raise ValueError("--clients and --rate must be positive")
    make_workload(args.workload, [], History())  # says now if it cannot run
    faults = parse_faults(args.faults)
    if args.workload == "broker" and MEMBER_CHANGE in faults:
        raise ValueError("member-change runs with the log workload only (--workload log)")
    if args.secure and MEMBER_CHANGE in faults:
        raise ValueError("member-change does not run against a secured cluster (leave out --secure)")
    if args.workload == "broker":
        from cluster.chaos.broker_workload import BrokerWorkloadConfig
        workload_config: object = BrokerWorkloadConfig(
            producers=args.clients if args.clients != LogWorkloadConfig.clients else BrokerWorkloadConfig.producers,
            rate_per_producer=args.rate if args.rate != LogWorkloadConfig.rate_per_client
            else BrokerWorkloadConfig.rate_per_producer, official=not args.no_official)
    else:
        workload_config = LogWorkloadConfig(idempotent=not args.no_idempotence, clients=args.clients,
                                            rate_per_client=args.rate)
    node_args: list[str] = []
    for flag in NODE_FLAGS:
        value = getattr(args, "node_" + flag[2:].replace("-", "_"))
        if value is not None:
            node_args += [flag, value]
    election_max = float(args.node_election_timeout_max or DEFAULT_ELECTION_TIMEOUT_MAX_S)
    return ChaosOptions(
        out_dir=Path(args.out), nodes=args.nodes, duration_s=args.duration, faults=faults,
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31),
        workload=args.workload, node_args=tuple(node_args),
        workload_config=workload_config,
        schedule=ScheduleConfig(min_pause_s=2 * election_max), keep_data=args.keep_data, secure=args.secure,
        front_ends=not args.no_front_ends, move_silence_s=2 * election_max + 0.5)


def run(args: argparse.Namespace) -> int:
    from cluster.chaos.runner import run_chaos

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        options = options_from(args)
    except (ValueError, WorkloadUnavailable) as error:
        print(f"dledger chaos: error: {error}", file=sys.stderr, flush=True)
        return 2
    print(f"dledger chaos: seed {options.seed}, "
          f"{options.duration_s:g} s, faults {','.join(options.faults)}, output in {options.out_dir}",
          file=sys.stderr, flush=True)
    summary = asyncio.run(run_chaos(options))
    print(json.dumps(summary) if args.json else human_summary(summary), flush=True)
    return 0 if summary["valid"] else 1


def human_summary(summary: dict[str, Any]) -> str:
    if summary["workload"] == "broker":
        from cluster.chaos.broker_checker import BrokerCheckResult
        keys = ["seed", "messages", "acked", "failed", "unknown", "failed_client_calls", "deliveries",
                *BrokerCheckResult.FAILURES, "late_delayed", "max_unavailability_s", "max_without_delivery_s",
                "faults_injected", "recovery", "delivery_recovery", "valid"]
        lines = [f"{k}: {summary[k]}" for k in keys]
        lines.append(f"outputs: {summary['outputs']['summary']}, {summary['outputs']['timeline']}")
        return "\n".join(lines)
    keys = ["seed", "ops", "acked", "failed", "unknown", "lost", "duplicated", "diverged", "order_violations",
            "unexpected", "stale_leader_acks", "max_unavailability_s", "faults_injected", "recovery", "valid"]
    lines = [f"{k}: {summary[k]}" for k in keys]
    lines.append(f"outputs: {summary['outputs']['summary']}, {summary['outputs']['timeline']}")
    return "\n".join(lines)
