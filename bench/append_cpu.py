"""The append benchmarks of `bench.append` (1 KiB entries at 1, 16 and 128
in flight, one per call and 64 per call) against a running cluster, with the
CPU the three node processes spent per acknowledged entry (from /proc, pids
from `dledger status`): on a 2-core machine shared with the client, CPU per
entry says more than throughput alone (`node_cpu_us_per_entry`: the three
nodes together; `cpu_us_per_entry_by_node`: the leader, each follower and
this process, the client). Run it against a cluster from one checkout and
then another to compare them. One JSON line per configuration.

    python -m bench.append_cpu --servers 127.0.0.1:20911,... [--duration 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.append import CONFIGURATIONS, SIZE
from bench.proc_cpu import cpu_seconds_of
from cluster.bench import bench_append, report_errors
from dledger.client import DLedgerClient, parse_servers


async def node_pids(servers: str) -> dict[str, int]:
    """pid of each node, keyed "leader", "follower1", "follower2", ... (the
    leader's CPU and a follower's differ several times over)."""
    async with DLedgerClient(parse_servers(servers)) as client:
        rows = sorted((row for row in await client.cluster_status() if row["pid"]),
                      key=lambda row: (row["role"] != "LEADER", row["id"]))
    names = ["leader" if row["role"] == "LEADER" else f"follower{i}" for i, row in enumerate(rows)]
    return {name: row["pid"] for name, row in zip(names, rows)}


async def main(servers: str, duration_s: float) -> None:
    pids = await node_pids(servers)
    for inflight, batch in CONFIGURATIONS:
        before = {**cpu_seconds_of(pids), "client": time.process_time()}
        result = await bench_append(servers, SIZE, inflight, duration_s, batch)
        after = {**cpu_seconds_of(pids), "client": time.process_time()}
        report_errors(result)
        used = sum(after[n] - before[n] for n in after if n in before and n != "client")
        line = result.to_json()
        line["node_cpu_us_per_entry"] = round(used / max(1, result.acked_entries) * 1e6, 1)
        # Each node's and this process's (the client's) CPU per entry.
        line["cpu_us_per_entry_by_node"] = {
            name: round((after[name] - before[name]) / max(1, result.acked_entries) * 1e6, 1)
            for name in after if name in before}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per configuration")
    args = parser.parse_args()
    asyncio.run(main(args.servers, args.duration))
