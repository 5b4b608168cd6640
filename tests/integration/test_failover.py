"""Three real node processes on loopback: append 10,000 entries, SIGKILL the
leader, keep appending through the failover, restart the killed node, and check
that every acknowledged entry is there and the committed logs are identical."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class ProcessCluster:
    def __init__(self, base: Path, size: int = 3, extra: list[str] | None = None) -> None:
        ports = free_ports(size)
        self.ids = [f"n{i}" for i in range(size)]
        self.addresses = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, ports)}
        self.base = base
        self.extra = extra or []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def peers(self) -> str:
        return ",".join(f"{n}={a}" for n, a in self.addresses.items())

    def start(self, node: str) -> None:
        log = open(self.base / f"{node}.log", "ab")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.procs[node] = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "node", "--id", node, "--peers", self.peers,
             "--data-dir", str(self.base / node), *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def kill(self, node: str) -> None:
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


async def leader_of(client: DLedgerClient, addresses: list[str], timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for address in addresses:
            meta = await client.metadata(address)
            if meta is not None and meta.role == "LEADER":
                return meta.self_id
        await asyncio.sleep(0.05)
    raise AssertionError("no leader")


async def committed_log(client: DLedgerClient, node: str) -> list[tuple[int, int, bytes, int]]:
    return [(e.index, e.term, e.body, e.chain_crc) async for e in client.read(from_id=node)]


async def test_leader_sigkill_loses_no_acknowledged_entry(tmp_path: Path):
    cluster = ProcessCluster(tmp_path, extra=["--data-file-size", str(1 << 20), "--max-entry-size", str(64 << 10)])
    for node in cluster.ids:
        cluster.start(node)
    client = DLedgerClient(list(cluster.addresses.values()), deadline_s=20.0)
    acked: dict[int, bytes] = {}
    try:
        leader = await leader_of(client, list(cluster.addresses.values()))

        # 10,000 entries, 100 per call, 8 calls in flight.
        async def writer(worker: int) -> None:
            for batch in range(worker, 100, 8):
                bodies = [f"entry-{batch * 100 + i}".encode() for i in range(100)]
                result = await client.append(bodies)
                for offset, body in enumerate(bodies):
                    acked[result.first_index + offset] = body

        await asyncio.gather(*(writer(w) for w in range(8)))
        assert len(acked) == 10_000

        # Keep appending one at a time while the leader dies.
        stop = asyncio.Event()
        after_kill: list[float] = []
        killed_at = 0.0

        async def trickle() -> None:
            n = 0
            while not stop.is_set():
                body = f"trickle-{n}".encode()
                n += 1
                invoked_at = time.monotonic()
                try:
                    result = await client.append([body])
                except DLedgerError:
                    continue  # outcome unknown: it may or may not be in the log
                acked[result.first_index] = body
                if killed_at and invoked_at > killed_at:
                    after_kill.append(time.monotonic())

        task = asyncio.ensure_future(trickle())
        await asyncio.sleep(0.5)
        killed_at = time.monotonic()
        cluster.kill(leader)
        survivors = [a for n, a in cluster.addresses.items() if n != leader]
        deadline = time.monotonic() + 20
        while len(after_kill) < 50 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(after_kill) >= 50, "appends did not resume after the leader was killed"
        failover_s = after_kill[0] - killed_at
        new_leader = await leader_of(client, survivors)
        assert new_leader != leader

        # The killed node comes back on the same data dir and catches up.
        cluster.start(leader)
        await asyncio.sleep(1.0)
        stop.set()
        await task
        final = await client.append([b"final"])
        acked[final.first_index] = b"final"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metas = [await client.metadata(a) for a in cluster.addresses.values()]
            if all(m is not None and m.committed_index >= final.first_index for m in metas):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the restarted node did not catch up: {metas}")

        logs = {node: await committed_log(client, node) for node in cluster.ids}
        shortest = min(len(log) for log in logs.values())
        prefixes = {node: log[:shortest] for node, log in logs.items()}
        assert prefixes["n0"] == prefixes["n1"] == prefixes["n2"], "committed prefixes differ"
        by_index = {index: body for index, _, body, _ in logs[new_leader]}
        missing = [i for i, body in acked.items() if by_index.get(i) != body]
        assert not missing, f"{len(missing)} acknowledged entries missing, e.g. {missing[:5]}"
        print(f"failover: first append acknowledged {failover_s * 1000:.0f} ms after SIGKILL")
    finally:
        await client.close()
        cluster.stop_all()
