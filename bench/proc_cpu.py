"""CPU time of processes from Linux /proc: the benchmarks share a 2-core
machine with the cluster they measure, so they report where the CPU went,
not only how fast it went."""
from __future__ import annotations

import os
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
