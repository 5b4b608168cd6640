"""Give processes a fixed share of the CPU, as if each ran on a machine of
its own size: a cgroup per process with a CPU quota (CFS bandwidth control).

Benchmarks use it where a question is about capacity rather than about this
machine: whether a topic's throughput grows with its broker groups is a
question about groups that each have their own CPUs, which two shared cores
cannot answer, but three nodes per group limited to a fraction of a core
each can (the client, unlimited, then has the rest).

cgroup v2 where the unified hierarchy offers the cpu controller, else the
v1 cpu hierarchy; either needs root. `CpuLimits.available()` says why not.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

PERIOD_US = 100_000
V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOT = Path("/sys/fs/cgroup/cpu")
PARENT = "pydledger-bench"


def _v2() -> bool:
    try:
        return "cpu" in (V2_ROOT / "cgroup.controllers").read_text().split()
    except OSError:
        return False


class CpuLimits:
    """Each process limited with `limit` gets a cgroup of its own; `close`
    removes them once the processes have exited."""

    def __init__(self) -> None:
        self.v2 = _v2()
        self.parent = (V2_ROOT if self.v2 else V1_ROOT) / f"{PARENT}-{os.getpid()}"
        self._groups: list[Path] = []

    @staticmethod
    def available() -> str | None:
        """None if limits can be set here, else why not."""
        if os.geteuid() != 0:
            return "setting CPU quotas needs root"
        if not _v2() and not (V1_ROOT / "cpu.cfs_quota_us").exists():
            return f"no cgroup cpu controller ({V2_ROOT}/cgroup.controllers has no cpu, and {V1_ROOT} is not mounted)"
        return None

    def limit(self, pid: int, name: str, cores: float) -> None:
        """Process `pid` (every thread of it, and any it starts) gets at most
        `cores` of a core's time."""
        if not self._groups:
            self.parent.mkdir(exist_ok=True)
            if self.v2:
                (self.parent / "cgroup.subtree_control").write_text("+cpu")
        group = self.parent / name
        group.mkdir()
        self._groups.append(group)
        quota = max(1000, int(cores * PERIOD_US))
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        """Remove the cgroups (a cgroup goes only once its processes are gone:
        wait briefly for the kernel to see them exit)."""
        for group in [*self._groups, self.parent]:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self._groups.clear()
