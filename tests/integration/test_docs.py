"""The manual cannot rot: every fenced shell block marked runnable
(an info string of "sh runnable") in README.md and docs/*.md runs, as
written, against a local three-node cluster started the way `make run`
starts one (`dledger cluster up`). The documented ports (gRPC 20911-20913,
metrics 21011-21013) are moved to free ones; everything else is the text
the reader copies. A block passes when it exits 0 (bash -e -o pipefail)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.process_cluster import ROOT
from tests.integration.test_cli import free_base_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DOCUMENTED_BASE_PORT = 20911
FENCE = re.compile(r"^```sh runnable\s*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runnable_blocks() -> list[tuple[str, int, str]]:
    """(file, line, text) of every runnable block."""
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((str(path.relative_to(ROOT)), line, match.group(1)))
    return blocks


def with_ports(text: str, base: int) -> str:
    def move(match: re.Match[str]) -> str:
        return str(base + int(match.group(0)) - DOCUMENTED_BASE_PORT)
    return re.sub(r"\b(2091[1-9]|2101[1-9])\b", move, text)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("docs-cluster")
    base = free_base_port(3)
    log = open(data / "cluster.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "cluster", "up", "--nodes", "3",
                             "--data-dir", str(data / "data"), "--base-port", str(base)],
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ready leader="):
                break
            assert time.monotonic() < deadline, "the cluster did not get ready"
        else:
            raise AssertionError(f"`dledger cluster up` ended: {(data / 'cluster.log').read_text()[-2000:]}")
        yield base, data
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_the_docs_have_runnable_blocks():
    assert len(runnable_blocks()) >= 2


@pytest.mark.parametrize("where,line,block", runnable_blocks(), ids=lambda v: str(v)[:40])
def test_a_runnable_block_runs_as_written(cluster, where: str, line: int, block: str, tmp_path: Path):
    base, _ = cluster
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # The blocks start from the project's root, as the README's reader does
    # (`. .venv/bin/activate`): the venv the tests run in stands for it.
    script = with_ports(block, base).replace(". .venv/bin/activate", f". {Path(sys.executable).parent}/activate"
                                              if (Path(sys.executable).parent / "activate").exists() else "true")
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, (f"{where}:{line} failed (exit {done.returncode})\n--- stdout\n"
                                  f"{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}")
