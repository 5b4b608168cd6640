"""Send throughput through the broker: broker.client against the official
RocketMQ 5 Python client (rocketmq-python-client) on the same workload, and
the replicated log's own append throughput for the cost of the broker.

    python -m bench.send [--servers H:P,...] [--size 1024] [--inflight 64] [--batch 64]
                         [--duration 10] [--skip-official] [--front-ends]

Without --servers it starts its own three-node cluster (cluster/process_cluster.py)
in a temporary directory. One JSON line per run, each with the client, the
mode and messages/s with p50/p99 latency per call:

    log      `dledger bench append` with batches of --batch (the log's own figure)
    single   K concurrent single sends; broker.client lets waiting sends share calls
    unshared K concurrent single sends, one SendMessage call each (coalescing off)
    batched  K/4 concurrent batches of --batch messages
    official K concurrent send_async() of the official client (one message per call),
             in a subprocess: it cannot share a process with our generated protos

With --front-ends the cluster it starts has front ends (broker/config.py)
and broker.client sends through them (a follower's port, which forwards to
the leader) instead of to the leader itself: the cost of the extra hop.
The official client is routed to the front ends either way once they exist.

Each line also says where the CPU went, in microseconds per message:
"cpu_us_per_message" has each node (when the benchmark started the cluster)
and the client (the official one measured in its own process, its start-up
left out). Last, a summary line: the broker's best send figure as a share of
the log's ("broker_cost" = 1 - send/log; the issue asks for at most 0.25).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

from bench.proc_cpu import CpuMeter
from cluster.bench import bench_append
from cluster.broker_bench import bench_send
from cluster.process_cluster import DEFAULT_NODE_FILES, ProcessCluster, find_leader
from dledger.client import DLedgerClient

ROOT = Path(__file__).resolve().parents[1]

OFFICIAL = textwrap.dedent("""
    import json, os, sys, time, concurrent.futures as cf
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    servers, topic = sys.argv[1], sys.argv[2]
    size, inflight, duration = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    producer = Producer(ClientConfiguration(servers.replace(",", ";"), Credentials()), (topic,))
    producer.startup()
    body = os.urandom(size)
    def message():
        m = Message(); m.topic = topic; m.body = body
        return m
    try:
        producer.send(message())
        latencies, errors, sent = [], 0, 0
        start = time.perf_counter(); stop_at = start + duration; cpu = time.process_time()
        running = {}
        while True:
            now = time.perf_counter()
            while now < stop_at and len(running) < inflight:
                running[producer.send_async(message())] = time.perf_counter()
            if not running:
                break
            done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
            finished = time.perf_counter()
            for future in done:
                began = running.pop(future)
                if future.exception() is None:
                    latencies.append(finished - began); sent += 1
                else:
                    errors += 1
        elapsed = time.perf_counter() - start
        latencies.sort()
        pick = lambda f: latencies[max(1, int(-(-f * len(latencies) // 1))) - 1] if latencies else 0.0
        print(json.dumps({"messages": sent, "duration_s": elapsed, "p50_ms": pick(0.5) * 1000,
                          "p99_ms": pick(0.99) * 1000, "errors": errors, "cpu_s": time.process_time() - cpu}))
    finally:
        producer.shutdown()
""")


OFFICIAL_CONSUME = textwrap.dedent("""
    import json, sys, threading, time, concurrent.futures as cf
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
    servers, topic, group = sys.argv[1], sys.argv[2], sys.argv[3]
    target, receivers, batch, duration = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    consumer = SimpleConsumer(ClientConfiguration(servers.replace(",", ";"), Credentials()), group,
                              {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    lock = threading.Lock()
    counts = {"received": 0, "acked": 0, "errors": 0}
    done = threading.Event()
    acks = cf.ThreadPoolExecutor(4 * receivers)

    def ack(message):
        try:
            consumer.ack(message)
            key = "acked"
        except Exception:
            key = "errors"
        with lock:
            counts[key] += 1
            if counts["acked"] >= target:
                done.set()

    def receive(stop_at):
        while not done.is_set() and time.perf_counter() < stop_at:
            try:
                messages = consumer.receive(batch, 60)
            except Exception:
                with lock:
                    counts["errors"] += 1
                time.sleep(0.05)
                continue
            with lock:
                counts["received"] += len(messages)
            for message in messages:
                acks.submit(ack, message)

    try:
        start = time.perf_counter(); cpu = time.process_time()
        threads = [threading.Thread(target=receive, args=(start + duration,), daemon=True) for _ in range(receivers)]
        for thread in threads:
            thread.start()
        done.wait(duration)
        elapsed = time.perf_counter() - start
        used = time.process_time() - cpu
        print(json.dumps({**counts, "duration_s": elapsed, "cpu_s": used}), flush=True)
    finally:
        done.set()
        acks.shutdown(wait=False, cancel_futures=True)
        consumer.shutdown()
""")


def official_consume(servers: str, topic: str, messages: int, receivers: int, batch: int,
                     duration: float) -> dict[str, Any]:
    """The official client's SimpleConsumer: `receivers` threads receiving
    `batch` at a time, each message acked by a pool of threads (its
    ack_async returns no future), until `messages` are acked; the topic must
    hold them already. The clock runs from the first receive to the last ack."""
    group = f"BenchOfficialConsume-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([sys.executable, "-c", OFFICIAL_CONSUME, servers, topic, group, str(messages),
                           str(receivers), str(batch), str(duration)],
                          capture_output=True, text=True, timeout=duration + 120, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"official consumer failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = result["duration_s"] or 1.0
    return {"client": "official", "mode": "official_consume", "receivers": receivers, "batch": batch,
            "messages": result["acked"], "received": result["received"], "errors": result["errors"],
            "duration_s": round(elapsed, 3), "messages_per_s": round(result["acked"] / elapsed, 1),
            "client_cpu_s": result["cpu_s"]}


def official_send(servers: str, topic: str, size: int, inflight: int, duration: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", OFFICIAL, servers, topic, str(size), str(inflight), str(duration)],
                          capture_output=True, text=True, timeout=duration + 120, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"official client failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = result["duration_s"] or 1.0
    return {"client": "official", "mode": "official", "size": size, "inflight": inflight, "batch": 1,
            "duration_s": round(elapsed, 3), "messages": result["messages"],
            "messages_per_s": round(result["messages"] / elapsed, 1),
            "mb_per_s": round(result["messages"] * size / elapsed / 1e6, 3),
            "p50_ms": round(result["p50_ms"], 3), "p99_ms": round(result["p99_ms"], 3), "errors": result["errors"],
            "client_cpu_s": result["cpu_s"]}


async def run(servers: str, args: argparse.Namespace, node_pids: dict[str, int] | None = None,
              client_servers: str | None = None) -> list[dict[str, Any]]:
    """`client_servers`: where broker.client sends (default `servers`)."""
    lines: list[dict[str, Any]] = []
    meter = CpuMeter(node_pids or {})

    def emit(line: dict[str, Any], messages: int | None = None, client_cpu_s: float | None = None) -> None:
        if messages is not None:
            line["cpu_us_per_message"] = meter.per_message(messages, client_cpu_s)
        lines.append(line)
        print(json.dumps(line), flush=True)

    meter.start()
    log = (await bench_append(servers, args.size, max(1, args.inflight // 4), args.duration, args.batch)).to_json()
    emit({"client": "dledger", "mode": "log", **log, "messages_per_s": log["acks_per_s"]},
         round(log["acks_per_s"] * log["duration_s"]))
    runs = [("single", args.inflight, 1, True), ("unshared", args.inflight, 1, False),
            ("batched", max(1, args.inflight // 4), args.batch, True)]
    for mode, inflight, batch, coalesce in runs:
        meter.start()
        result = await bench_send(client_servers or servers, "BenchSend", args.size, inflight, batch, args.duration,
                                  coalesce=coalesce, admin_servers=servers)
        emit({"client": "pydledger", **result.to_json(), "mode": mode}, result.messages)
    if not args.skip_official:
        meter.start()
        official = official_send(servers, "BenchSend", args.size, args.inflight, args.duration)
        emit(official, official["messages"], official.pop("client_cpu_s"))
    best = max(line["messages_per_s"] for line in lines if line["client"] == "pydledger")
    log_rate = lines[0]["messages_per_s"]
    emit({"summary": True, "log_messages_per_s": log_rate, "best_send_messages_per_s": best,
          "broker_cost": round(1 - best / log_rate, 3) if log_rate else None})
    return lines


async def main_async(args: argparse.Namespace) -> None:
    if args.servers:
        await run(args.servers, args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-send-") as base:
        cluster = ProcessCluster(Path(base), extra_args=DEFAULT_NODE_FILES, front_ends=args.front_ends)
        cluster.start()
        try:
            async with DLedgerClient(list(cluster.addresses.values())) as client:
                await find_leader(client, list(cluster.addresses.values()))
            await run(",".join(cluster.addresses.values()), args,
                      {node: proc.pid for node, proc in cluster.procs.items()},
                      ",".join(cluster.front_ends.values()) or None)
        finally:
            cluster.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", help="a running cluster (default: start one)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--skip-official", action="store_true")
    parser.add_argument("--front-ends", action="store_true",
                        help="start the cluster with front ends and send through them (the extra hop's cost)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
