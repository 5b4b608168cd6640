"""Node processes under a test's, a benchmark's or the chaos harness's control:
start each one with `python -m cluster.cli node`, SIGKILL it, start it again on
the same data dir, pause it with SIGSTOP and resume it with SIGCONT.
(`dledger cluster up` is the user-facing launcher; this is for tools that need
to kill and restart individual nodes.)

By default every node reaches its peers at their real addresses. With
`routes`, each node is told to dial, for each peer's real address, a proxy of
the link A->B instead (`--peer-routes`): every node names the same real
addresses in --peers and in configuration entries, clients talk to nodes
directly, and only peer traffic crosses the proxies.

`spares` reserves addresses (and ids) for servers that membership changes
add later (`add_node`), and `alternates` a second address per id, for a
member moved to a new address (`move_node`): a fault network can then put
proxies in front of every address a run may use before any node starts."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from dledger import failpoints
from dledger.client import DLedgerClient
from dledger.config import DLedgerConfig

ROOT = Path(__file__).resolve().parent.parent


# Ports handed out lie below Linux's ephemeral range (32768 and up): a port
# the kernel picked there could, while its node was down (killed, about to
# be restarted on it), become the source port of some outgoing connection,
# and the restart then failed "Address already in use". Each pytest-xdist
# worker draws from its own slice, in order, so two workers, or two tests
# of one, are not handed the same port; callers that use a port as a base
# (base+100 metrics, base+300 front ends) find PORT_HEADROOM above it free.
PORT_RANGE = (22000, 32500)
PORT_HEADROOM = 500
_next_port: int | None = None     # where this process looks next


def _port_slice() -> tuple[int, int]:
    low, high = PORT_RANGE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and workers > 1:
        span = (high - low) // workers
        low += int(worker[2:]) % workers * span
        high = low + span
    return low, high - PORT_HEADROOM


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` ports nothing listens on, none handed out before by this
    process (until its slice wraps round)."""
    return [free_base_port((0,)) for _ in range(count)]


def free_base_port(offsets: Iterable[int]) -> int:
    """A base port B with B+offset free for every offset (`dledger cluster up
    --base-port B` uses B+i, B+100+i, B+300+i...); nothing up to its highest
    offset is handed out again by this process (until its slice wraps round)."""
    global _next_port
    wanted = sorted(set(offsets))
    assert wanted[0] >= 0 and wanted[-1] < PORT_HEADROOM, wanted
    low, high = _port_slice()
    base = _next_port if _next_port is not None else low + os.getpid() % (high - low)
    for _ in range(high - low):
        if all(_bindable(base + offset) for offset in wanted):
            after = base + wanted[-1] + 1
            _next_port = after if after < high else low
            return base
        base = base + 1 if base + 1 < high else low
    raise OSError(f"no free ports at offsets {wanted} of a base in {low}-{high}")


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
                 front_ends: bool = False, spares: int = 0, alternates: bool = False,
                 metrics: bool = False) -> None:
        # Broker groups side by side name their nodes g<g>n<i> (id_prefix "g0n").
        self.ids = [f"{id_prefix}{i}" for i in range(size)]
        # Every id this cluster may ever use, with every address each may
        # listen on (the first is where it starts).
        self.slots = {f"{id_prefix}{i}": [f"127.0.0.1:{p}" for p in free_ports(2 if alternates else 1)]
                      for i in range(size + spares)}
        # With `tls_dir` (made by cluster.certs.create for these ids): mutual
        # TLS between peers on ports of their own; `addresses` stay the
        # addresses clients use (TLS).
        self.tls_dir = tls_dir
        self.addresses = {n: self.slots[n][0] for n in self.ids}
        ports = free_ports(size) if tls_dir else []
        self.peer_addresses = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, ports)} if tls_dir \
            else self.addresses
        # With `front_ends`: every node's front end (broker/config.py), which
        # the routes then give clients.
        self.front_ends = {n: f"127.0.0.1:{p}" for n, p in zip(self.ids, free_ports(size))} if front_ends else {}
        # With `metrics`: every node's metrics port, as `dledger cluster up`
        # gives one (the console, /metrics and the raw reads Spark uses).
        self.metrics_ports = dict(zip(self.ids, free_ports(size))) if metrics else {}
        # Each address peers may dial gets a peer link port of its own
        # (--peer-link-port), so that a fault network can put a proxy in
        # front of the link as well (FaultNetwork's `link_of`).
        dialed = [a for addresses in self.peer_slots.values() for a in addresses]
        self.link_addresses = {a: f"127.0.0.1:{p}" for a, p in zip(dialed, free_ports(len(dialed)))}
        self.base = base
        self.log_dir = log_dir or base
        # Node files sized for tests and tools: the default 1 GiB data segments
        # (plus 160 MiB of index), preallocated, are 3.5 GB per cluster before
        # anything is written. Arguments given override these.
        self.extra_args = [*SMALL_NODE_FILES, *(extra_args or [])]
        # node -> (a peer's real address -> the address this node dials for
        # it, a proxy); None: real addresses.
        self.routes: dict[str, dict[str, str]] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        # Servers added with add_node: node -> the members its --peers names.
        self.joining: dict[str, list[str]] = {}
        base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def peers(self) -> str:
        return ",".join(f"{n}={self.peer_addresses[n]}" for n in self.ids)

    @property
    def advertised(self) -> str:
        return ",".join(f"{n}={self.addresses[n]}" for n in self.ids)

    def peers_of(self, node: str) -> str:
        """The --peers value node `node` starts with."""
        if node in self.joining:
            return ",".join(f"{n}={self.peer_addresses[n]}" for n in [*self.joining[node], node])
        return self.peers

    def add_node(self, node: str, members: list[str]) -> str:
        """Start a new server with --join, its --peers naming `members` (the
        group's current members) and itself, for `dledger member add`.
        Returns its address (its reserved one, if `node` is a spare)."""
        self.addresses[node] = self.slots[node][0] if node in self.slots else f"127.0.0.1:{free_ports(1)[0]}"
        if self.tls_dir is not None:
            self.peer_addresses[node] = f"127.0.0.1:{free_ports(1)[0]}"
        if node not in self.ids:
            self.ids.append(node)
        self.joining[node] = [m for m in members if m != node]
        self.start(node)
        return self.addresses[node]

    def move_node(self, node: str, members: list[str]) -> str:
        """Start `node` again at its other reserved address, with --join and
        whatever its data dir holds (the caller empties it for a new
        machine), for `dledger member replace` under the same id. Returns
        the new address."""
        addresses = self.slots[node]
        address = addresses[(addresses.index(self.addresses[node]) + 1) % len(addresses)]
        self.addresses[node] = address
        self.joining[node] = [m for m in members if m != node]
        self.start(node)
        return address

    def forget_node(self, node: str) -> None:
        """`node` left the group: stop it (SIGKILL) and delete its data; its
        id and addresses may be used again by a later add_node."""
        if node in self.procs:
            self.kill(node)
        if node in self.ids:
            self.ids.remove(node)
        self.joining.pop(node, None)
        if node in self.slots:
            self.addresses[node] = self.slots[node][0]
        self.wipe(node)

    def wipe(self, node: str) -> None:
        """Delete a stopped node's data (a new disk), and what it recorded
        for the harness about its old files."""
        shutil.rmtree(self.base / node, ignore_errors=True)
        (self.failpoints_dir(node) / failpoints.FLUSHED_POSITION).unlink(missing_ok=True)

    def free_slots(self) -> list[str]:
        return [n for n in self.slots if n not in self.ids]

    @property
    def peer_slots(self) -> dict[str, list[str]]:
        """Every address peers may dial, per id (for the fault proxies): the
        slots, or with mutual TLS the peers' own ports (no spares or second
        addresses then: membership changes are not run secured)."""
        if self.tls_dir is None:
            return self.slots
        return {n: [self.peer_addresses[n]] for n in self.ids}

    @property
    def every_address(self) -> list[str]:
        """Every address a node of this cluster may listen on (for clients)."""
        return [a for addresses in self.slots.values() for a in addresses]

    def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else self.ids:
            routing = [] if self.tls_dir is None else ["--advertised-addresses", self.advertised]
            if self.routes is not None:
                routing += ["--peer-routes", ",".join(f"{a}={via}" for a, via in self.routes[node_id].items())]
            routing += self.tls_args(node_id)
            if self.front_ends:
                routing += ["--front-ends", ",".join(f"{n}={a}" for n, a in self.front_ends.items())]
            if node_id in self.joining:
                routing.append("--join")
            if node_id in self.metrics_ports:
                routing += ["--metrics-port", str(self.metrics_ports[node_id])]
            routing += ["--peer-link-port", self.link_port(self.peer_addresses[node_id])]
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

    def link_port(self, peer_address: str) -> str:
        if peer_address not in self.link_addresses:
            self.link_addresses[peer_address] = f"127.0.0.1:{free_ports(1)[0]}"
        return self.link_addresses[peer_address].rpartition(":")[2]

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
        proc = self.procs.pop(node, None)
        self.paused.discard(node)
        if proc is None:
            return   # stopped already (by a membership change, say)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

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


async def wait_serving(client: DLedgerClient, addresses: list[str], timeout: float = 15.0) -> None:
    """Until every address answers Metadata: a leader is elected once two of
    three nodes listen, and on a loaded machine the third may not yet."""
    deadline = time.monotonic() + timeout
    waiting = list(addresses)
    while True:
        waiting = [a for a in waiting if await client.metadata(a) is None]
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{waiting} not answering within {timeout}s")
        await asyncio.sleep(0.05)


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
