"""CPU time of processes from Linux /proc: the benchmarks share a 2-core
machine with the cluster they measure, so they report where the CPU went,
not only how fast it went."""
from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces):
    index 1 is the parent pid, 11-14 utime, stime, cutime, cstime in ticks."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (OSError once it is gone)."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_seconds_of(pids: dict[str, int]) -> dict[str, float]:
    """cpu_seconds of each named process; processes already gone are left out."""
    used = {}
    for name, pid in pids.items():
        try:
            used[name] = cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            continue
    return used


class CpuMeter:
    """CPU the nodes (when the benchmark started them, so it knows their
    pids) and the client spent during one run, as microseconds per message:
    the machine is shared, so a figure without where the CPU went says little."""

    def __init__(self, node_pids: dict[str, int]) -> None:
        self.node_pids = node_pids
        self.nodes: dict[str, float] = {}
        self.client = 0.0

    def start(self) -> None:
        self.nodes, self.client = cpu_seconds_of(self.node_pids), time.process_time()

    def node_seconds(self) -> dict[str, float]:
        """CPU seconds of each node since start()."""
        now = cpu_seconds_of(self.node_pids)
        return {node: now[node] - self.nodes[node] for node in now if node in self.nodes}

    def per_message(self, messages: int, client_cpu_s: float | None = None, client_name: str = "client",
                    nodes: dict[str, float] | None = None) -> dict[str, float]:
        """us per message of each node and of the client: this process, unless
        the client ran elsewhere and says what it used (client_cpu_s)."""
        used = dict(self.node_seconds() if nodes is None else nodes)
        used[client_name] = time.process_time() - self.client if client_cpu_s is None else client_cpu_s
        return {name: round(seconds * 1e6 / max(messages, 1), 1) for name, seconds in used.items()}
