"""A compose project of deploy/docker-compose.yml under a test's control:
build the image, bring the three nodes up on free host ports, kill, start,
cut off and reconnect containers for real, and remove everything it made.

It drives the `docker` CLI and whichever compose is installed (the plugin
`docker compose` or the standalone `docker-compose`); nothing is mocked.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from cluster.process_cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
NODE_IDS = ("n0", "n1", "n2")
# Each node preallocates its first segments: DLedger's defaults (1 GiB of
# data, 160 MiB of index) would take 3.5 GB of a CI machine's disk for a few
# kilobytes of entries.
SMALL_SEGMENTS = {"DLEDGER_DATA_FILE_SIZE": str(16 << 20), "DLEDGER_INDEX_FILE_SIZE": str(1 << 20)}
PROJECT_LABEL = "com.docker.compose.project"


def run(*argv: str, check: bool = True, timeout: float = 120.0,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; a failure says what failed and why."""
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result


def docker_unavailable_reason() -> str | None:
    """Why the Docker tests cannot run here, or None when they can."""
    if os.environ.get("PYDLEDGER_DOCKER_TESTS", "1") == "0":
        return "PYDLEDGER_DOCKER_TESTS=0"
    if shutil.which("docker") is None:
        return "no docker command on PATH"
    try:
        info = run("docker", "info", "--format", "{{.ServerVersion}}", check=False, timeout=20)
    except subprocess.TimeoutExpired:
        return "docker info timed out"
    if info.returncode != 0:
        last_line = (info.stderr.strip().splitlines() or [f"exit code {info.returncode}"])[-1]
        return f"no Docker engine reachable (docker info: {last_line})"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return None


def compose_command() -> list[str] | None:
    if run("docker", "compose", "version", check=False, timeout=20).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    return None


def build_image(tag: str, script: str = "build-image.sh", **env_vars: str) -> float:
    """`make image`'s script (or `make image-spark`'s), tagging only `tag`
    (not :latest, which a developer's own cluster may be using); returns the
    seconds it took."""
    started = time.monotonic()
    env = dict(os.environ, PYTHON=sys.executable, IMAGE=tag, TAG_LATEST="no", **env_vars)
    run(str(ROOT / "deploy" / script), env=env, timeout=900)
    return time.monotonic() - started


@dataclass
class BuiltImage:
    tag: str
    build_s: float


@dataclass
class ComposeProject:
    image: str
    # `DLEDGER_` settings for every node on top of the compose file's, through
    # an override file (compose's own mechanism), e.g. smaller segment files.
    node_env: dict[str, str] = field(default_factory=dict)
    override_dir: Path | None = None
    name: str = field(default_factory=lambda: f"pydledger-e2e-{os.getpid()}-{secrets.token_hex(3)}")
    ports: dict[str, int] = field(default_factory=dict)          # node id -> published gRPC port
    metrics_ports: dict[str, int] = field(default_factory=dict)  # node id -> published metrics port
    aliases: dict[str, list[str]] = field(default_factory=dict)  # node id -> its DNS names, kept across a cut
    compose_file: Path = COMPOSE_FILE
    # Variables the compose file itself reads (PYDLEDGER_SECURE_DIR, ...).
    compose_env: dict[str, str] = field(default_factory=dict)
    # Compose profiles to enable (the `spark` services).
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        command = compose_command()
        assert command is not None
        self.command = command + ["--project-name", self.name, "--file", str(self.compose_file)]
        for profile in self.profiles:
            self.command += ["--profile", profile]
        if self.node_env:
            assert self.override_dir is not None, "node_env needs a directory for the override file"
            override = self.override_dir / f"{self.name}.override.yml"
            # JSON is YAML, and needs no YAML library here.
            override.write_text(json.dumps({"services": {node: {"environment": self.node_env}
                                                         for node in NODE_IDS}}, indent=2))
            self.command += ["--file", str(override)]
        ports = free_ports(3 * len(NODE_IDS))
        self.ports = dict(zip(NODE_IDS, ports))
        self.metrics_ports = dict(zip(NODE_IDS, ports[len(NODE_IDS):]))
        # Client links: each node's port, published as itself.
        self.link_ports = dict(zip(NODE_IDS, ports[2 * len(NODE_IDS):]))

    @property
    def servers(self) -> list[str]:
        return [f"127.0.0.1:{self.ports[node]}" for node in NODE_IDS]

    def compose(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYDLEDGER_IMAGE=self.image, **self.compose_env)
        for node in NODE_IDS:
            env[f"PYDLEDGER_{node.upper()}_PORT"] = str(self.ports[node])
            env[f"PYDLEDGER_{node.upper()}_METRICS_PORT"] = str(self.metrics_ports[node])
            env[f"PYDLEDGER_{node.upper()}_LINK_PORT"] = str(self.link_ports[node])
        return run(*self.command, *args, env=env, timeout=timeout)

    def up(self) -> None:
        self.compose("up", "-d", "--no-build")

    def container(self, node: str) -> str:
        container_id = self.compose("ps", "-q", node).stdout.strip()
        assert container_id, f"no container for {node}"
        return container_id

    def health(self, node: str) -> str:
        return run("docker", "inspect", "--format", "{{.State.Health.Status}}", self.container(node)).stdout.strip()

    def wait_healthy(self, timeout_s: float = 120.0) -> float:
        """Seconds until Docker reports every node healthy (its own HEALTHCHECK)."""
        started = time.monotonic()
        while True:
            states = {node: self.health(node) for node in NODE_IDS}
            if all(state == "healthy" for state in states.values()):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"not healthy after {timeout_s:.0f} s: {states}\n{self.logs()}")
            time.sleep(0.5)

    def kill(self, node: str) -> None:
        run("docker", "kill", self.container(node))

    def start(self, node: str) -> None:
        run("docker", "start", self.container(node))

    def network(self, node: str) -> str:
        networks = json.loads(run("docker", "inspect", "--format", "{{json .NetworkSettings.Networks}}",
                                  self.container(node)).stdout)
        (name,) = networks
        return name

    def disconnect(self, node: str) -> None:
        """Cut the node off the cluster's network; its DNS names go with it,
        so they are remembered for `reconnect`."""
        container, network = self.container(node), self.network(node)
        settings = json.loads(run("docker", "inspect", "--format", "{{json .NetworkSettings.Networks}}",
                                  container).stdout)[network]
        self.aliases[node] = list(settings.get("Aliases") or [node])
        run("docker", "network", "disconnect", network, container)

    def reconnect(self, node: str, network: str) -> None:
        alias_args = [arg for alias in self.aliases.pop(node) for arg in ("--alias", alias)]
        run("docker", "network", "connect", *alias_args, network, self.container(node))

    @contextlib.contextmanager
    def exec_background(self, node: str, *argv: str) -> Iterator[subprocess.Popen[str]]:
        """`docker exec` a command that prints "ready" once it is set up;
        yields it after that line, and kills it on the way out."""
        process = subprocess.Popen(["docker", "exec", self.container(node), *argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            first = process.stdout.readline() if process.stdout else ""
            if first.strip() != "ready":
                raise RuntimeError(f"{argv[0]} in {node} did not get ready: {first}{process.communicate()[1]}")
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def logs(self, tail: int = 30) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail)).stdout

    @contextlib.contextmanager
    def running(self) -> Iterator["ComposeProject"]:
        """Up; on the way out, down, and nothing of the project may be left."""
        try:
            self.up()
            yield self
        finally:
            self.down()
            assert not self.leftovers(), f"compose project {self.name} left {self.leftovers()}"

    def down(self) -> None:
        """Remove every container, network and volume of the project, even
        ones compose lost track of."""
        try:
            self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5")
        finally:
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        label = f"label={PROJECT_LABEL}={self.name}"
        for kind, remove in (("container", ["docker", "rm", "-f", "-v"]),
                             ("network", ["docker", "network", "rm"]),
                             ("volume", ["docker", "volume", "rm", "-f"])):
            listing = ["docker", "ps", "-aq"] if kind == "container" else ["docker", kind, "ls", "-q"]
            ids = run(*listing, "--filter", label, check=False).stdout.split()
            if ids:
                run(*remove, *ids, check=False)

    def leftovers(self) -> list[str]:
        label = f"label={PROJECT_LABEL}={self.name}"
        found = run("docker", "ps", "-aq", "--filter", label).stdout.split()
        for kind in ("network", "volume"):
            found += run("docker", kind, "ls", "-q", "--filter", label).stdout.split()
        return found
