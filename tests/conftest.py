"""Test-session wiring shared by every directory.

`make test` runs the suite on two pytest-xdist workers (`--dist loadgroup`):
most of the suite's wall time is spent waiting (elections, fsyncs, timers,
Docker builds), not computing, so two workers finish in much less time on
two cores. Tests that must not run beside each other share a group, and a
group runs on one worker:

- `docker`: the compose files publish fixed ports (20911-20913, 21011-21013),
  and the docs test may pick the same documented ports for its own cluster;
  the node image is built once per worker that needs it, so one worker only.
- `spark`: one SparkSession per worker (a JVM and 5-20 s to start): one.

Every other test runs in the group of its module, so that a module-scoped
fixture (a cluster of node processes shared by a module's tests) is started
once, on one worker, not once per worker its tests were spread over.
"""
from __future__ import annotations

import pytest

# Directory (under tests/) or file -> the xdist group its tests run in.
SERIAL_GROUPS = {
    "tests/docker/": "docker",
    "tests/integration/test_docs.py": "docker",
    "tests/spark/": "spark",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = next((group for prefix, group in SERIAL_GROUPS.items() if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))
