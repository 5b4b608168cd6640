"""`dledger cluster up`: a local cluster of node processes in the foreground.

Node i is `n<i>`, serves gRPC on base-port+i and metrics on base-port+100+i,
and keeps its files in `<data-dir>/n<i>`. With `--groups G` (G > 1) there are
G broker groups `g0..g<G-1>` behind one name server (gRPC on base-port+90,
metrics on base-port+190): node i of group g is `g<g>n<i>`, serves gRPC on
base-port+10g+i and metrics on base-port+100+10g+i, and keeps its files in
`<data-dir>/g<g>n<i>`. Each node is its own process
(`python -m cluster.cli node ...`), so that chaos tools can SIGKILL one and
restart it with `dledger node` on the same data dir: the launcher reports a
node that dies and never restarts it. Ctrl-C or SIGTERM stops them all:
SIGTERM to each, then SIGKILL to any still running after a timeout.

With front ends (the default; `--no-front-ends` to go without) node i also
serves the messaging protocol on base-port+300+i (group g's node i on
base-port+300+10g+i) while it does not lead: routes point RocketMQ clients
there, so a leader that dies or stalls cuts none of their connections
(broker/config.py, cluster/front_end.py).

With `--secure` (cluster/secure_setup.py) the launcher first makes a CA,
node certificates and the super user `admin`'s secret under
`<data-dir>/secure/` (kept for the next start), then runs every node with
TLS for clients on base-port+i, mutual TLS between peers on
base-port+200+i, and authentication and ACLs on. With several groups as
well, node i of group g talks mutual TLS on base-port+200+10g+i, and the
name server serves clients over TLS on base-port+90 and members (the
groups' registrations) over mutual TLS on base-port+290, with auth on.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.secure_setup import PEER_PORT_OFFSET, SecureSetup
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError
from dledger.membership import Membership

METRICS_PORT_OFFSET = 100
FRONT_END_PORT_OFFSET = 300
NAMESRV_PORT_OFFSET = 90
GROUP_PORT_STRIDE = 10
# How long the nodes get to stop cleanly before SIGKILL.
STOP_TIMEOUT_S = 10.0
# Past this, the launcher says the cluster is not ready but keeps running.
READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class NodeSpec:
    id: str
    host: str
    port: int
    metrics_port: int
    data_dir: str
    peer_port: int = 0   # with --secure: the members-only mutual-TLS port
    group: str = ""      # empty: the --group of `cluster up`
    front_end_port: int = 0   # 0: no front end

    @property
    def front_end(self) -> str:
        return f"{self.host}:{self.front_end_port}" if self.front_end_port else ""

    @property
    def peer_address(self) -> str:
        return f"{self.host}:{self.peer_port or self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def plan_nodes(count: int, data_dir: str, base_port: int, host: str = "127.0.0.1",
               secure: bool = False, front_ends: bool = False) -> list[NodeSpec]:
    if count < 1:
        raise ValueError("--nodes must be at least 1")
    if count > METRICS_PORT_OFFSET:
        # More would put node 100's gRPC port on node 0's metrics port.
        raise ValueError(f"--nodes must be at most {METRICS_PORT_OFFSET}")
    top = FRONT_END_PORT_OFFSET if front_ends else PEER_PORT_OFFSET if secure else METRICS_PORT_OFFSET
    highest = base_port + top + count - 1
    if not (0 < base_port and highest < 65536):
        raise ValueError(f"--base-port {base_port}: the ports would leave 1..65535")
    return [NodeSpec(f"n{i}", host, base_port + i, base_port + METRICS_PORT_OFFSET + i,
                     str(Path(data_dir) / f"n{i}"), base_port + PEER_PORT_OFFSET + i if secure else 0,
                     front_end_port=base_port + FRONT_END_PORT_OFFSET + i if front_ends else 0)
            for i in range(count)]


def plan_groups(groups: int, count: int, data_dir: str, base_port: int,
                host: str = "127.0.0.1", secure: bool = False,
                front_ends: bool = False) -> tuple[list[NodeSpec], NodeSpec]:
    """The nodes of `groups` broker groups and their name server (its
    NodeSpec's port and metrics port, and with `secure` its members' port;
    no data)."""
    if not 1 < groups <= NAMESRV_PORT_OFFSET // GROUP_PORT_STRIDE:
        raise ValueError(f"--groups must be 1..{NAMESRV_PORT_OFFSET // GROUP_PORT_STRIDE}")
    if not 1 <= count <= GROUP_PORT_STRIDE:
        raise ValueError(f"--nodes must be 1..{GROUP_PORT_STRIDE} with several groups")
    top = FRONT_END_PORT_OFFSET if front_ends else PEER_PORT_OFFSET if secure else METRICS_PORT_OFFSET
    highest = base_port + top + NAMESRV_PORT_OFFSET
    if not (0 < base_port and highest < 65536):
        raise ValueError(f"--base-port {base_port}: the ports would leave 1..65535")
    peer = PEER_PORT_OFFSET if secure else None

    def peer_port(offset: int) -> int:
        return base_port + peer + offset if peer is not None else 0

    nodes = [NodeSpec(f"g{g}n{i}", host, base_port + GROUP_PORT_STRIDE * g + i,
                      base_port + METRICS_PORT_OFFSET + GROUP_PORT_STRIDE * g + i,
                      str(Path(data_dir) / f"g{g}n{i}"), peer_port(GROUP_PORT_STRIDE * g + i), group=f"g{g}",
                      front_end_port=base_port + FRONT_END_PORT_OFFSET + GROUP_PORT_STRIDE * g + i
                      if front_ends else 0)
             for g in range(groups) for i in range(count)]
    namesrv = NodeSpec("namesrv", host, base_port + NAMESRV_PORT_OFFSET,
                       base_port + METRICS_PORT_OFFSET + NAMESRV_PORT_OFFSET, "", peer_port(NAMESRV_PORT_OFFSET))
    return nodes, namesrv


def peers_flag(nodes: list[NodeSpec]) -> str:
    return ",".join(f"{n.id}={n.peer_address}" for n in nodes)


def node_command(node: NodeSpec, nodes: list[NodeSpec], group: str, secure: SecureSetup | None = None,
                 namesrv: NodeSpec | None = None) -> list[str]:
    members = [n for n in nodes if n.group == node.group]
    command = [sys.executable, "-m", "cluster.cli", "node", "--id", node.id,
               "--peers", peers_flag(members), "--data-dir", node.data_dir,
               "--metrics-port", str(node.metrics_port), "--group", node.group or group,
               "--exit-with-parent", str(os.getpid())]
    if namesrv is not None:
        # Secured: the name server's members' port (mutual TLS).
        command += ["--namesrv-addrs", namesrv.peer_address]
    if node.front_end:
        command += ["--front-ends", ",".join(f"{n.id}={n.front_end}" for n in members)]
    if secure is not None:
        command += ["--advertised-addresses", ",".join(f"{n.id}={n.address}" for n in members),
                    *secure.node_args(node.id)]
    return command


def namesrv_command(namesrv: NodeSpec, secure: SecureSetup | None = None) -> list[str]:
    command = [sys.executable, "-m", "cluster.cli", "nameserver", "--listen", namesrv.address,
               "--metrics-port", str(namesrv.metrics_port), "--exit-with-parent", str(os.getpid())]
    if secure is not None:
        command += ["--peer-listen", namesrv.peer_address, *secure.node_args(namesrv.id)]
    return command


def _child_env() -> dict[str, str]:
    # The children import `cluster` and `dledger` from this checkout even
    # when the project is not installed into the interpreter.
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def say(line: str) -> None:
    print(line, flush=True)


class Launcher:
    def __init__(self, nodes: list[NodeSpec], group: str = "default", secure: SecureSetup | None = None,
                 namesrv: NodeSpec | None = None) -> None:
        self.nodes = nodes
        self.group = group
        self.secure = secure
        self.namesrv = namesrv
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()
        self._ready = False
        self._all_died_early = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        try:
            await self._spawn_all()
            watched = self.nodes + ([self.namesrv] if self.namesrv is not None else [])
            watchers = [asyncio.create_task(self._watch(n)) for n in watched]
            ready = asyncio.create_task(self._announce_ready())
            await self._stop.wait()
            for task in [ready, *watchers]:
                task.cancel()
            await asyncio.gather(ready, *watchers, return_exceptions=True)
        finally:
            await self._stop_all()
        return 0 if not self._all_died_early else 1

    async def _spawn_all(self) -> None:
        env = _child_env()
        if self.namesrv is not None:
            # First, so that the leaders' first registrations find it.
            process = await asyncio.create_subprocess_exec(*namesrv_command(self.namesrv, self.secure), env=env,
                                                           stdin=asyncio.subprocess.DEVNULL)
            self.processes[self.namesrv.id] = process
            members = f" members={self.namesrv.peer_address}" if self.secure is not None else ""
            say(f"namesrv grpc={self.namesrv.address}{members} "
                f"metrics=http://{self.namesrv.host}:{self.namesrv.metrics_port}/metrics pid={process.pid}")
        for node in self.nodes:
            Path(node.data_dir).mkdir(parents=True, exist_ok=True)
            process = await asyncio.create_subprocess_exec(
                *node_command(node, self.nodes, self.group, self.secure, self.namesrv), env=env,
                stdin=asyncio.subprocess.DEVNULL)
            self.processes[node.id] = process
            front_end = f" front-end={node.front_end}" if node.front_end else ""
            say(f"{node.id} grpc={node.address} metrics=http://{node.host}:{node.metrics_port}/metrics "
                f"data={node.data_dir} pid={process.pid}{front_end}")
        say(f"servers {','.join(n.address for n in self.nodes)}")
        if any(n.front_end for n in self.nodes):
            say(f"front ends {','.join(n.front_end for n in self.nodes)}")
        if self.secure is not None:
            say(f"secure: TLS CA {self.secure.ca_file}, user admin, secret {self.secure.admin_secret_file} "
                f"(dledger ... --user admin --secret-file {self.secure.admin_secret_file} "
                f"--tls-ca {self.secure.ca_file})")

    async def _watch(self, node: NodeSpec) -> None:
        process = self.processes[node.id]
        code = await process.wait()
        if self._stop.is_set():
            return
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        print(f"node {node.id} (pid {process.pid}) died with {how}; not restarting it",
              file=sys.stderr, flush=True)
        if all(p.returncode is not None for p in self.processes.values()) and not self._ready:
            print("every node died before the cluster was ready; stopping", file=sys.stderr, flush=True)
            self._all_died_early = True
            self._stop.set()

    async def _announce_ready(self) -> None:
        """Print `ready leader=ID term=T` once every node answers Metadata and
        they agree on a leader."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + READY_TIMEOUT_S
        security = self.secure.admin_security() if self.secure is not None else None
        groups = list(dict.fromkeys(n.group for n in self.nodes))
        clients = {g: DLedgerClient([n.address for n in self.nodes if n.group == g], g or self.group,
                                    security=security) for g in groups}
        leaders: dict[str, tuple[str, int]] = {}
        try:
            while True:
                for group, client in clients.items():
                    if group not in leaders:
                        leader = await _agreed_leader(client)
                        if leader is not None:
                            leaders[group] = leader
                if len(leaders) == len(groups):
                    self._ready = True
                    say(" ".join(["ready"] + [f"{g}:leader={leaders[g][0]} term={leaders[g][1]}" if g
                                              else f"leader={leaders[g][0]} term={leaders[g][1]}" for g in groups]))
                    return
                if loop.time() > give_up:
                    print(f"cluster not ready after {READY_TIMEOUT_S:.0f} s; still waiting",
                          file=sys.stderr, flush=True)
                    give_up = float("inf")
                await asyncio.sleep(0.1)
        finally:
            for client in clients.values():
                await client.close()

    async def _stop_all(self) -> None:
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            for process in running:
                if process.returncode is None:
                    print(f"pid {process.pid} did not stop in {STOP_TIMEOUT_S:.0f} s; killing it",
                          file=sys.stderr, flush=True)
                    _signal(process, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in running))
        say("stopped")


async def _agreed_leader(client: DLedgerClient) -> tuple[str, int] | None:
    try:
        rows = await client.cluster_status()
    except DLedgerError:
        return None
    if not rows or any(r["role"] == "unreachable" for r in rows):
        return None
    leaders = {(r["leader_id"], r["term"]) for r in rows}
    leader_id, term = next(iter(leaders))
    if len(leaders) != 1 or leader_id is None:
        return None
    return leader_id, term


def _signal(process: asyncio.subprocess.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass  # it exited between the check and the signal


def check_data_dirs(nodes: list[NodeSpec]) -> None:
    """ValueError when a node's data directory belongs to a group whose
    members are at other addresses than these (`--base-port` changed, say):
    a node keeps the configuration its data directory started with and
    ignores `--peers` (dledger/membership.py), so such a cluster would never
    elect a leader."""
    for node in nodes:
        path = Path(node.data_dir) / f"dledger-{node.id}" / "membership"
        if not path.exists():
            continue
        try:
            saved = {m.id: m.address for m in Membership.from_json(path.read_text()).members}
        except (OSError, ValueError, KeyError, TypeError):
            continue   # the node itself says what is wrong with it
        planned = {n.id: n.peer_address for n in nodes if n.group == node.group}
        moved = sorted(f"{i} at {saved[i]}, not {planned[i]}" for i in saved.keys() & planned.keys()
                       if saved[i] != planned[i])
        if moved:
            raise ValueError(f"{path.parent.parent} belongs to a group with {'; '.join(moved)}: start it with the "
                             "--base-port (and --secure) it was created with, or use another --data-dir")


async def cluster_up(count: int, data_dir: str, base_port: int, group: str = "default",
                     secure: bool = False, groups: int = 1, front_ends: bool = False) -> int:
    namesrv = None
    if groups > 1:
        nodes, namesrv = plan_groups(groups, count, data_dir, base_port, secure=secure, front_ends=front_ends)
    else:
        nodes = plan_nodes(count, data_dir, base_port, secure=secure, front_ends=front_ends)
    setup = None
    if secure:
        group_names = list(dict.fromkeys(n.group for n in nodes))
        ids = [n.id for n in nodes] + ([namesrv.id] if namesrv is not None else [])
        # The official client verifies a route's whole address list as one
        # name: each group's node ports, and its front ends when there are.
        endpoint_lists = [[n.address for n in nodes if n.group == g] for g in group_names]
        endpoint_lists += [[n.front_end for n in nodes if n.group == g] for g in group_names if front_ends]
        setup = SecureSetup.prepare(Path(data_dir), ids, endpoint_lists)
    return await Launcher(nodes, group, setup, namesrv).run()
