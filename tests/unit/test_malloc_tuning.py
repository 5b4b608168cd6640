"""The node's malloc tuning (cluster/malloc_tuning.py): with it, megabyte
buffers made and dropped one after another reuse the process's pages instead
of page-faulting fresh ones in; PYDLEDGER_MALLOC_TUNING=0 leaves glibc's
defaults. Each case runs in a process of its own (the settings are per process)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, resource
from cluster.malloc_tuning import tune_malloc
took = tune_malloc()
run = os.urandom(1 << 20)
def window():
    # A window of answers on their way out (each a fresh 1 MiB buffer, as a
    # raw run's answer is), all dropped once sent.
    held = [b"".join((b"head", run)) for _ in range(16)]
    del held
for _ in range(3):
    window()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    window()
print(json.dumps({"took": took, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def probe(tuning: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYDLEDGER_MALLOC_TUNING": tuning}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_megabyte_buffers_reuse_pages_with_the_tuning_and_fault_them_in_without() -> None:
    tuned, default = probe("1"), probe("0")
    assert tuned["took"] and not default["took"]
    # 320 buffers of 256 pages each: glibc's defaults give the freed window
    # back to the kernel and fault every page in again; tuned, the same pages
    # serve every window.
    assert default["faults"] > 320 * 128, default
    assert tuned["faults"] < 320 * 8, tuned
