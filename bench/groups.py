"""Send and consume throughput over one broker group against several, on
this machine, in one session (issue 16).

    python -m bench.groups [--groups 1,2] [--duration 8] [--messages 20000] [--size 1024]
                           [--inflight 64] [--batch 1] [--pin] [--node-cpus F]

For each G it starts a name server and G groups of three node processes
(cluster/process_cluster.py), creates one topic with 8 queues in every
group, runs `bench send` (broker.client, from one group's addresses: the
producer spreads over the groups itself) and `bench consume` (prefill
--messages, then receive and ack them all), and prints one JSON line per
run with messages/s and the CPU each process spent per message
("cpu_us_per_message"; "group_cpu_us_per_message" sums each group's
nodes). With --pin, the processes of group g (and the client) are pinned to
core g mod the cores there are (taskset), so that groups do not share a
core. With --node-cpus F, every node process may use at most F of a core
(a cgroup CPU quota, bench/cpu_limit.py; needs root): each group then has
CPUs of its own, as groups on their own machines have, while the client
and the name server share what is left; that asks whether a topic's
throughput grows with its groups, which two shared cores cannot.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.cpu_limit import CpuLimits
from bench.proc_cpu import CpuMeter
from broker.client import AdminClient
from cluster.broker_bench import bench_consume, bench_send
from cluster.process_cluster import NameServerProcess, ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

TOPIC = "BenchGroups"
QUEUES_PER_GROUP = 8


def start(base: Path, groups: int) -> tuple[NameServerProcess, dict[str, ProcessCluster]]:
    namesrv = NameServerProcess(base / "logs")
    namesrv.start()
    clusters = {}
    for g in range(groups):
        name = f"g{g}"
        clusters[name] = ProcessCluster(base / name, id_prefix=f"{name}n", log_dir=base / "logs",
                                        extra_args=["--group", name, "--namesrv-addrs", namesrv.address])
        clusters[name].start()
    return namesrv, clusters


def pin(namesrv: NameServerProcess, clusters: dict[str, ProcessCluster]) -> None:
    cores = os.cpu_count() or 1
    for g, cluster in enumerate(clusters.values()):
        for proc in cluster.procs.values():
            # -a: every thread of the node (gRPC's, the flush thread), not
            # only its main one, which is all `taskset -p` alone moves.
            subprocess.run(["taskset", "-a", "-p", "-c", str(g % cores), str(proc.pid)], check=True,
                           capture_output=True)
    # The client and the name server share the last group's core... unless
    # there is a core left over.
    spare = len(clusters) % cores
    os.sched_setaffinity(0, {spare})
    if namesrv.proc is not None:
        os.sched_setaffinity(namesrv.proc.pid, {spare})


async def wait_ready(namesrv: NameServerProcess, clusters: dict[str, ProcessCluster]) -> None:
    deadline = time.monotonic() + 60
    async with grpc.aio.insecure_channel(namesrv.address) as channel:
        stub = namesrv_pb2_grpc.NameServerStub(channel)
        while True:
            try:
                info = await stub.ClusterInfo(npb.ClusterInfoRequest(), timeout=5)
                if len(info.groups) == len(clusters):
                    break
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the groups did not register")
            await asyncio.sleep(0.2)
    for cluster in clusters.values():
        async with AdminClient(list(cluster.addresses.values()), deadline_s=60) as admin:
            await admin.create_topic(TOPIC, QUEUES_PER_GROUP, "normal")
    # Until a route from g0 shows every group (each leader registers the
    # topic a moment after creating it): a producer caches its first route.
    async with grpc.aio.insecure_channel(next(iter(clusters["g0"].addresses.values()))) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC), endpoints=pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))
        while True:
            route = await stub.QueryRoute(request, metadata=[("x-mq-client-id", "bench-groups")], timeout=10)
            if len({q.broker.name for q in route.message_queues}) == len(clusters):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the route of {TOPIC} does not show every group")
            await asyncio.sleep(0.1)


def cpu_line(meter: CpuMeter, messages: int, clusters: dict[str, ProcessCluster]) -> dict[str, Any]:
    per_process = meter.per_message(messages)
    per_group = {g: round(sum(v for k, v in per_process.items() if k.startswith(f"{g}n")), 1) for g in clusters}
    return {"cpu_us_per_message": per_process, "group_cpu_us_per_message": per_group}


async def run_one(groups: int, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        namesrv, clusters = start(Path(tmp), groups)
        limits = CpuLimits()
        try:
            if args.pin:
                pin(namesrv, clusters)
            if args.node_cpus:
                for cluster in clusters.values():
                    for node, proc in cluster.procs.items():
                        limits.limit(proc.pid, node, args.node_cpus)
            await wait_ready(namesrv, clusters)
            servers = list(clusters["g0"].addresses.values())
            pids = {n: p.pid for c in clusters.values() for n, p in c.procs.items()}
            meter = CpuMeter(pids)
            meter.start()
            sent = await bench_send(servers, TOPIC, args.size, args.inflight, args.batch, args.duration)
            print(json.dumps({"groups": groups, "pinned": args.pin, "node_cpus": args.node_cpus, **sent.to_json(),
                              **cpu_line(meter, sent.messages, clusters)}), flush=True)
            meter.start()
            consumed = await bench_consume(servers, TOPIC, None, args.size, args.messages, args.inflight // 4 or 1,
                                           32, 60.0)
            print(json.dumps({"groups": groups, "pinned": args.pin, "node_cpus": args.node_cpus,
                              **consumed.to_json(),
                              **cpu_line(meter, args.messages + consumed.messages, clusters),
                              "cpu_note": "per message sent (prefill) plus acked"}), flush=True)
        finally:
            for cluster in clusters.values():
                cluster.kill_all()
            namesrv.kill()
            limits.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="1,2", help="group counts to run, in order (default 1,2)")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--pin", action="store_true", help="pin group g's processes to core g (taskset)")
    parser.add_argument("--node-cpus", type=float, default=0.0, metavar="F",
                        help="limit every node process to F of a core (a cgroup CPU quota; needs root)")
    args = parser.parse_args()
    if args.node_cpus:
        why_not = CpuLimits.available()
        if why_not:
            parser.error(f"--node-cpus: {why_not}")
    for groups in (int(g) for g in args.groups.split(",")):
        asyncio.run(run_one(groups, args))


if __name__ == "__main__":
    main()
