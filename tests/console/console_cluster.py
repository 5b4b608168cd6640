"""A three-node cluster whose nodes serve metrics, and so the web console,
each on its own port (the console tests' fixture)."""
from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from unittest import mock

from cluster.config import ENV_METRICS_PORT
from cluster.process_cluster import ProcessCluster, free_ports
from tests.integration.broker_cluster import SPARSE_FILES


class ConsoleCluster(ProcessCluster):
    def __init__(self, base: Path, size: int = 3, tls_dir: Path | None = None, extra_args: tuple[str, ...] = ()
                 ) -> None:
        super().__init__(base, size, extra_args=[*SPARSE_FILES, *extra_args], tls_dir=tls_dir)
        self.metrics_ports = dict(zip(self.ids, free_ports(len(self.ids))))

    def start(self, node: str | None = None) -> None:
        # ProcessCluster gives every node the same flags: the port goes by environment.
        for node_id in [node] if node else self.ids:
            with mock.patch.dict(os.environ, {ENV_METRICS_PORT: str(self.metrics_ports[node_id])}):
                super().start(node_id)

    def console_url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[node]}/console/"

    def wait_for_console(self, node: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.console_url(node), timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
