"""Node processes under a test's or a benchmark's control: start each one with
`python -m cluster.cli node`, SIGKILL it, start it again on the same data dir.
(`dledger cluster up` is the user-facing launcher; this is for tools that need
to kill and restart individual nodes.)"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dledger.client import DLedgerClient

ROOT = Path(__file__).resolve().parent.parent


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class ProcessCluster:
    def __init__(self, base: Path, size: int = 3, extra_args: list[str] | None = None) -> None:
        ports = free_ports(size)
        self.ids = [f"n{i}" for i in range(size)]
        self.addresses = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, ports)}
        self.base = base
        self.extra_args = extra_args or []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        base.mkdir(parents=True, exist_ok=True)

    @property
    def peers(self) -> str:
        return ",".join(f"{n}={a}" for n, a in self.addresses.items())

    def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else self.ids:
            log = open(self.base / f"{node_id}.log", "ab")
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            self.procs[node_id] = subprocess.Popen(
                [sys.executable, "-m", "cluster.cli", "node", "--id", node_id, "--peers", self.peers,
                 "--data-dir", str(self.base / node_id), *self.extra_args],
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
                proc.wait()
        self.procs.clear()


async def find_leader(client: DLedgerClient, addresses: list[str], timeout: float = 15.0) -> str:
    """The id of the node that says it leads, polling Metadata."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for address in addresses:
            meta = await client.metadata(address)
            if meta is not None and meta.role == "LEADER":
                return meta.self_id
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no leader among {addresses} within {timeout}s")
