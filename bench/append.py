"""Append benchmarks of issue 2 against a running cluster (`make run`):
1 KiB entries at 1, 16 and 128 in flight, one entry per call and batched.
Prints one JSON line per configuration (the `dledger bench append` line).

    python -m bench.append [--servers 127.0.0.1:20911,...] [--duration 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json

from cluster.bench import bench_append, report_errors

DEFAULT_SERVERS = "127.0.0.1:20911,127.0.0.1:20912,127.0.0.1:20913"
SIZE = 1024
# (in flight, entries per call)
CONFIGURATIONS = [(1, 1), (16, 1), (128, 1), (1, 64), (16, 64), (128, 64)]


async def main(servers: str, duration_s: float) -> None:
    for inflight, batch in CONFIGURATIONS:
        result = await bench_append(servers, SIZE, inflight, duration_s, batch)
        report_errors(result)
        print(json.dumps(result.to_json()), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default=DEFAULT_SERVERS)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per configuration")
    args = parser.parse_args()
    asyncio.run(main(args.servers, args.duration))
