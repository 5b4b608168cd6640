"""bench/cpu_limit.py: a process given a tenth of a core uses about that,
measured from /proc while it spins (root and a cgroup cpu controller needed)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.cpu_limit import CpuLimits
from bench.proc_cpu import cpu_seconds

WHY_NOT = CpuLimits.available()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no CPU quotas here: {WHY_NOT}")
def test_a_spinning_process_limited_to_a_tenth_of_a_core_gets_about_that():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 20\n"
                                "while time.monotonic() < end: pass"])
    limits = CpuLimits()
    try:
        limits.limit(spinner.pid, "spinner", 0.1)
        assert (limits.parent / "spinner").is_dir()
        before, started = cpu_seconds(spinner.pid), time.monotonic()
        time.sleep(1.5)
        share = (cpu_seconds(spinner.pid) - before) / (time.monotonic() - started)
        assert share < 0.2, f"limited to 0.1 core, it used {share:.2f}"
    finally:
        spinner.kill()
        spinner.wait()
        limits.close()
    assert not limits.parent.exists(), "the cgroups were left behind"
