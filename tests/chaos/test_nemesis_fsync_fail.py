"""The fsync-fail fault's heal: a node whose fdatasync failed is started
again once it has stopped, even when its shutdown outlasts the fault's window
(the heal used to look once, and left such a node down until another fault
restarted it)."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

from cluster.chaos.history import History
from cluster.chaos.nemesis import Nemesis
from dledger import failpoints


class SlowToStop:
    """A node process that exits `after` seconds from now."""

    def __init__(self, after: float) -> None:
        self.exit_at = asyncio.get_running_loop().time() + after
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and asyncio.get_running_loop().time() >= self.exit_at:
            self.returncode = 3
        return self.returncode


class FakeCluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.ids = ["n0", "n1", "n2"]
        self.procs: dict[str, object] = {}
        self.started: list[str] = []

    def failpoints_dir(self, node: str) -> Path:
        path = self.base / node
        path.mkdir(exist_ok=True)
        return path

    def arm_failpoint(self, node: str, name: str) -> None:
        (self.failpoints_dir(node) / name).touch()

    def running(self, node: str) -> bool:
        return True

    def start(self, node: str) -> None:
        self.started.append(node)


async def fault_on_one_node(tmp_path: Path) -> tuple[FakeCluster, str, object]:
    cluster = FakeCluster(tmp_path)
    nemesis = Nemesis(cluster, None, History(), None, None)  # type: ignore[arg-type]
    fault = await nemesis.fsync_fail(random.Random(7))
    [node] = [n for n in cluster.ids if (cluster.failpoints_dir(n) / failpoints.FSYNC).exists()]
    return cluster, node, fault


async def test_a_node_still_stopping_when_the_fault_heals_is_started_once_it_exits(tmp_path):
    cluster, node, fault = await fault_on_one_node(tmp_path)
    (cluster.failpoints_dir(node) / failpoints.FSYNC).unlink()   # the node's fdatasync fired it
    cluster.procs[node] = SlowToStop(after=0.3)                  # and it is shutting down
    await fault.heal()
    assert cluster.started == [node]
    assert "it stopped (exit 3)" in fault.window.detail


async def test_a_node_whose_fault_never_fired_is_left_running(tmp_path):
    cluster, node, fault = await fault_on_one_node(tmp_path)
    cluster.procs[node] = SlowToStop(after=60)
    await fault.heal()
    assert cluster.started == []
    assert not (cluster.failpoints_dir(node) / failpoints.FSYNC).exists()   # disarmed
