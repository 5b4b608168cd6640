"""Node processes under a test's, a benchmark's or the chaos harness's control:
start each one with `python -m cluster.cli node`, SIGKILL it, start it again on
the same data dir, pause it with SIGSTOP and resume it with SIGCONT.
(`dledger cluster up` is the user-facing launcher; this is for tools that need
to kill and restart individual nodes.)

By default every node reaches its peers at their real addresses. With
`routes`, each node gets its own peer map (node A may reach B through a proxy
of the link A->B) and advertises the real addresses to clients, so that
clients talk to nodes directly and only peer traffic crosses the proxies."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dledger import failpoints
from dledger.client import DLedgerClient
from dledger.config import DLedgerConfig

ROOT = Path(__file__).resolve().parent.parent


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


SMALL_NODE_FILES = ["--data-file-size", str(64 << 20), "--index-file-size", str(32 << 16),
                    "--preallocate", "false"]
# What `dledger cluster up` and `make run` use (DLedgerConfig's defaults):
# benchmarks that report what a user gets pass these.
DEFAULT_NODE_FILES = ["--data-file-size", str(DLedgerConfig.data_file_size),
                      "--index-file-size", str(DLedgerConfig.index_file_size),
                      "--preallocate", "true" if DLedgerConfig.preallocate else "false"]


class ProcessCluster:
    def __init__(self, base: Path, size: int = 3, extra_args: list[str] | None = None,
                 log_dir: Path | None = None, tls_dir: Path | None = None, id_prefix: str = "n",
                 front_ends: bool = False) -> None:
        # Broker groups side by side name their nodes g<g>n<i> (id_prefix "g0n").
        self.ids = [f"{id_prefix}{i}" for i in range(size)]
        # With `tls_dir` (made by cluster.certs.create for these ids): mutual
        # TLS between peers on ports of their own; `addresses` stay the
        # addresses clients use (TLS).
        self.tls_dir = tls_dir
        ports = free_ports(size * 2 if tls_dir else size)
        self.addresses = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, ports)}
        self.peer_addresses = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, ports[size:])} if tls_dir \
            else self.addresses
        # With `front_ends`: every node's front end (broker/config.py), which
        # the routes then give clients.
        self.front_ends = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, free_ports(size))} if front_ends else {}
        self.base = base
        self.log_dir = log_dir or base
        # Node files sized for tests and tools: the default 1 GiB data segments
        # (plus 160 MiB of index), preallocated, are 3.5 GB per cluster before
        # anything is written. Arguments given override these.
        self.extra_args = [*SMALL_NODE_FILES, *(extra_args or [])]
        # node -> (member -> the address this node uses for it); None: real addresses.
        self.routes: dict[str, dict[str, str]] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        # Servers added with add_node: node -> the members its --peers names.
        self.joining: dict[str, list[str]] = {}
        base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def peers(self) -> str:
        return ",".join(f"{n}={a}" for n, a in self.peer_addresses.items())

    @property
    def advertised(self) -> str:
        return ",".join(f"{n}={a}" for n, a in self.addresses.items())

    def peers_of(self, node: str) -> str:
        """The --peers value node `node` starts with."""
        if node in self.joining:
            return ",".join(f"{n}={self.peer_addresses[n]}" for n in [*self.joining[node], node])
        if self.routes is None:
            return self.peers
        return ",".join(f"{n}={a}" for n, a in self.routes[node].items())

    def add_node(self, node: str, members: list[str]) -> str:
        """Start a new server with --join, its --peers naming `members` (the
        group's current members) and itself, for `dledger member add`.
        Returns its address."""
        self.addresses[node] = f"127.0.0.1:{free_ports(1)[0]}"
        if self.tls_dir is not None:
            self.peer_addresses[node] = f"127.0.0.1:{free_ports(1)[0]}"
        self.ids.append(node)
        self.joining[node] = list(members)
        self.start(node)
        return self.addresses[node]

    def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else self.ids:
            routing = [] if self.routes is None and self.tls_dir is None \
                else ["--advertised-addresses", self.advertised]
            routing += self.tls_args(node_id)
            if self.front_ends:
                routing += ["--front-ends", ",".join(f"{n}={a}" for n, a in self.front_ends.items())]
            if node_id in self.joining:
                routing.append("--join")
            log = open(self.log_dir / f"{node_id}.log", "ab")
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env[failpoints.ENV_DIR] = str(self.failpoints_dir(node_id))
            self.procs[node_id] = subprocess.Popen(
                [sys.executable, "-m", "cluster.cli", "node", "--id", node_id, "--peers", self.peers_of(node_id),
                 "--data-dir", str(self.base / node_id), *routing, *self.extra_args,
                 # A harness killed with SIGKILL leaves no node behind.
                 "--exit-with-parent", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            log.close()

    def tls_args(self, node: str) -> list[str]:
        if self.tls_dir is None:
            return []
        return ["--tls-cert-file", str(self.tls_dir / f"{node}.pem"),
                "--tls-key-file", str(self.tls_dir / f"{node}-key.pem"),
                "--peer-tls-ca-file", str(self.tls_dir / "ca.pem")]

    def failpoints_dir(self, node: str) -> Path:
        """Where a file named after a failpoint makes it fire once in that
        node's process (see dledger.failpoints)."""
        path = self.base / "failpoints" / node
        path.mkdir(parents=True, exist_ok=True)
        return path

    def arm_failpoint(self, node: str, name: str) -> None:
        (self.failpoints_dir(node) / name).touch()

    def kill(self, node: str) -> None:
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.paused.discard(node)

    def stop_node(self, node: str, timeout: float = 10.0) -> None:
        """SIGTERM: a clean stop (the node writes its checkpoint)."""
        self.resume(node)
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def pause(self, node: str) -> None:
        """SIGSTOP: the process keeps its sockets but runs no code, like a
        node stuck in a long GC pause or a VM that was frozen."""
        self.procs[node].send_signal(signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: str) -> None:
        if node in self.paused and node in self.procs:
            self.procs[node].send_signal(signal.SIGCONT)
        self.paused.discard(node)

    def running(self, node: str) -> bool:
        return node in self.procs

    def exited(self) -> dict[str, int]:
        """Nodes that exited on their own (not killed here), with exit codes."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def kill_all(self) -> None:
        """SIGKILL every node: the quick teardown when the files no longer matter."""
        for node in list(self.procs):
            self.kill(node)

    def stop_all(self) -> None:
        for node in list(self.paused):
            self.resume(node)  # a stopped process cannot act on SIGTERM
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


class NameServerProcess:
    """A name server (`dledger nameserver`) in its own process, to kill and
    restart like a node."""

    def __init__(self, log_dir: Path, extra_args: list[str] | None = None) -> None:
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        log = open(self.log_dir / f"namesrv-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "nameserver", "--listen", self.address, *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
        log.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


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
