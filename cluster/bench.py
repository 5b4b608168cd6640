"""`dledger bench append`: closed-loop append throughput and latency.

K workers share one client (one HTTP/2 channel per server, so K calls are
multiplexed on one connection, as a real producer would); each loops "append
B bodies of SIZE bytes, wait for the commit" until the duration is over. The
client coalesces calls that are waiting into shared RPCs, as a Kafka producer
batches records (`coalesce=False`: one RPC per call). An
acknowledged entry is one whose append call returned successfully; a failed
call counts nothing and is reported on stderr.
"""
from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

# After a failed call a worker pauses this long, so that a cluster without a
# leader is not hammered by K tight loops.
ERROR_PAUSE_S = 0.05


@dataclass
class BenchResult:
    size: int
    inflight: int
    batch: int
    duration_s: float
    acked_entries: int
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, float | int]:
        """The one JSON line outside tools read; keys fixed by issue 2."""
        elapsed = self.duration_s or math.inf
        ordered = sorted(self.latencies_s)
        return {
            "size": self.size,
            "inflight": self.inflight,
            "batch": self.batch,
            "duration_s": round(self.duration_s, 3),
            "acks_per_s": round(self.acked_entries / elapsed, 1),
            "mb_per_s": round(self.acked_entries * self.size / elapsed / 1e6, 3),
            "p50_ms": round(percentile(ordered, 0.50) * 1000, 3),
            "p99_ms": round(percentile(ordered, 0.99) * 1000, 3),
        }


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; 0 for an empty one."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


async def bench_append(servers: list[str] | str, size: int, inflight: int, duration_s: float,
                       batch: int = 1, group: str = "default", coalesce: bool = True,
                       links: bool = True) -> BenchResult:
    if size < 0 or inflight < 1 or batch < 1 or duration_s <= 0:
        raise ValueError("need --size >= 0, --inflight >= 1, --batch >= 1, --duration > 0")
    bodies = [os.urandom(size) for _ in range(batch)]
    result = BenchResult(size, inflight, batch, 0.0, 0)
    async with DLedgerClient(servers, group, coalesce=coalesce, links=links) as client:
        await client.leader()  # find it before the clock starts
        start = time.perf_counter()
        stop_at = start + duration_s
        await asyncio.gather(*(_worker(client, bodies, stop_at, result) for _ in range(inflight)))
        result.duration_s = time.perf_counter() - start
    return result


async def _worker(client: DLedgerClient, bodies: list[bytes], stop_at: float,
                  result: BenchResult) -> None:
    clock = time.perf_counter
    while clock() < stop_at:
        sent = clock()
        try:
            await client.append(bodies)
        except DLedgerError as error:
            if not result.errors:
                print(f"bench: append failed: {error}", file=sys.stderr, flush=True)
            result.errors[error.code.name] += 1
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        result.latencies_s.append(clock() - sent)
        result.acked_entries += len(bodies)


def report_errors(result: BenchResult) -> None:
    if result.errors:
        summary = ", ".join(f"{name}={count}" for name, count in result.errors.most_common())
        print(f"bench: failed calls: {summary}", file=sys.stderr, flush=True)
