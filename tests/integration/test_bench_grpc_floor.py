"""bench.grpc_floor runs end to end (a server process on a real port, the
client, /proc CPU readings) and prints the JSON lines the README quotes."""
from __future__ import annotations

import json
import subprocess
import sys

from cluster.process_cluster import free_ports


def test_grpc_floor_prints_one_line_per_mode() -> None:
    (port,) = free_ports(1)
    done = subprocess.run([sys.executable, "-m", "bench.grpc_floor", "--calls", "200", "--batch", "4",
                           "--concurrency", "4", "--port", str(port)],
                          capture_output=True, text=True, timeout=120, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["mode"] for line in lines] == ["stream", "unary"]
    for line in lines:
        assert line["batch"] == 4 and line["concurrency"] == 4
        assert line["messages_per_s"] > 0
        # The server did the work: it used CPU, and a call cost at least its messages.
        assert 0 < line["server_cpu_us_per_message"] <= line["server_cpu_us_per_call"]
        # The client's side is measured too, and the ceiling follows from both.
        assert line["client_cpu_us_per_message"] > 0
        both = line["server_cpu_us_per_message"] + line["client_cpu_us_per_message"]
        assert abs(line["ceiling_per_s_per_core"] - 1e6 / both) <= 0.01 * line["ceiling_per_s_per_core"] + 1
