"""Test-session wiring shared by every directory.

`make test` runs the suite on two pytest-xdist workers: most of the suite's
wall time is spent waiting (elections, fsyncs, timers, Docker builds), not
computing, so two workers finish in much less time on two cores. Which
tests may run beside which is decided by `SuiteScheduling` below: the suite
is cut into work units, each run whole on one worker.

- `docker`: every Docker test and the docs test. The compose files publish
  fixed ports (20911-20913, 21011-21013), which the docs test's own cluster
  may pick as well; and the node image is built once per worker that needs it.
- `spark`: every Spark test (one SparkSession per worker: a JVM, 5-20 s to start).
- every other module is a unit of its own, so that a module-scoped fixture
  (a cluster of node processes shared by a module's tests) starts once.

(xdist's own `--dist loadgroup` does this with `xdist_group` markers, but
with pytest 9 its renaming of test ids no longer takes effect: the hook
below replaces it.)
"""
from __future__ import annotations

from typing import Any

import pytest

# Directory (under tests/) or file -> the work unit its tests run in.
SERIAL_GROUPS = {
    "tests/docker/": "docker",
    "tests/integration/test_docs.py": "docker",
    "tests/spark/": "spark",
}


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its serial group, or its module."""
    path = nodeid.split("::", 1)[0]
    return next((group for prefix, group in SERIAL_GROUPS.items() if path.startswith(prefix)), path)


# The longest units start first, so that neither is left running alone at the end.
FIRST_UNITS = ("docker", "spark")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(FIRST_UNITS)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False   # units in collection order (above)

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SuiteScheduling(config, log)
