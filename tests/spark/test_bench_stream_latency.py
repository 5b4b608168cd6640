"""bench.replay's streaming-latency part runs end to end (three node
processes, a live-mode streaming query, appends seen in micro-batches). In
its own process: it starts and stops its own SparkSession, which must not be
the tests' shared one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def test_stream_latency_sees_every_append() -> None:
    done = subprocess.run([sys.executable, "-c", "from bench.replay import bench_stream_latency; "
                                                 "bench_stream_latency(appends=2)"],
                          capture_output=True, text=True, timeout=240, check=True)
    (line,) = [json.loads(text) for text in done.stdout.splitlines() if text.startswith("{")]
    assert line["bench"] == "stream_latency" and line["appends"] == 2
    # Every append was seen (an unseen one counts as infinity), within the 30 s the bench waits.
    assert 0 < line["p50_s"] <= line["max_s"] < 30
