"""Disk faults in real node processes: a node whose fdatasync fails stops
(non-zero exit, one clear log line) instead of acknowledging pages the disk
may never have received; restarted, it recovers and catches up."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_node_whose_fsync_fails_exits_non_zero_with_a_clear_line(tmp_path: Path):
    cluster = ProcessCluster(tmp_path)
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()), deadline_s=10.0)
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))
        await client.append([b"warm-up"])
        victim = next(n for n in cluster.ids if n != leader)
        cluster.arm_failpoint(victim, "fsync")
        acked = 0
        deadline = time.monotonic() + 30
        while victim not in cluster.exited() and time.monotonic() < deadline:
            try:
                await client.append([f"entry-{acked}".encode()])
                acked += 1
            except DLedgerError:
                pass
        assert cluster.exited().get(victim, 0) != 0, f"{victim} did not stop after a failed fdatasync"
        text = (tmp_path / f"{victim}.log").read_text()
        assert "fdatasync failed" in text and "stopping after a fatal error" in text
        assert "Traceback" not in text
        # The other two go on; the victim, restarted, catches up.
        await client.append([b"after"])
        cluster.procs.pop(victim)
        cluster.start(victim)
        end = (await client.metadata(cluster.addresses[leader])).ledger_end_index
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = await client.metadata(cluster.addresses[victim])
            if meta is not None and meta.ledger_end_index >= end:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"{victim} did not catch up to {end}")
    finally:
        await client.close()
        cluster.kill_all()
