"""Three real node processes on loopback: append 10,000 entries, SIGKILL the
leader, keep appending through the failover, restart the killed node, and check
that every acknowledged entry is there and the committed logs are identical."""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

async def committed_log(client: DLedgerClient, node: str) -> list[tuple[int, int, bytes, int]]:
    return [(e.index, e.term, e.body, e.chain_crc) async for e in client.read(from_id=node)]


async def test_leader_sigkill_loses_no_acknowledged_entry(tmp_path: Path):
    cluster = ProcessCluster(tmp_path, extra_args=["--data-file-size", str(1 << 20), "--max-entry-size", str(64 << 10)])
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()), deadline_s=20.0)
    acked: dict[int, bytes] = {}
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))

        # 10,000 entries, 100 per call, 8 calls in flight.
        async def writer(worker: int) -> None:
            for batch in range(worker, 100, 8):
                bodies = [f"entry-{batch * 100 + i}".encode() for i in range(100)]
                result = await client.append(bodies)
                for offset, body in enumerate(bodies):
                    acked[result.first_index + offset] = body

        await asyncio.gather(*(writer(w) for w in range(8)))
        assert len(acked) == 10_000

        # Keep appending one at a time while the leader dies.
        stop = asyncio.Event()
        after_kill: list[float] = []
        killed_at = 0.0

        async def trickle() -> None:
            n = 0
            while not stop.is_set():
                body = f"trickle-{n}".encode()
                n += 1
                invoked_at = time.monotonic()
                try:
                    result = await client.append([body])
                except DLedgerError:
                    continue  # outcome unknown: it may or may not be in the log
                acked[result.first_index] = body
                if killed_at and invoked_at > killed_at:
                    after_kill.append(time.monotonic())

        task = asyncio.ensure_future(trickle())
        await asyncio.sleep(0.5)
        killed_at = time.monotonic()
        cluster.kill(leader)
        survivors = [a for n, a in cluster.addresses.items() if n != leader]
        deadline = time.monotonic() + 20
        while len(after_kill) < 50 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(after_kill) >= 50, "appends did not resume after the leader was killed"
        failover_s = after_kill[0] - killed_at
        new_leader = await find_leader(client, survivors)
        assert new_leader != leader

        # The killed node comes back on the same data dir and catches up.
        cluster.start(leader)
        await asyncio.sleep(1.0)
        stop.set()
        await task
        final = await client.append([b"final"])
        acked[final.first_index] = b"final"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metas = [await client.metadata(a) for a in cluster.addresses.values()]
            if all(m is not None and m.committed_index >= final.first_index for m in metas):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the restarted node did not catch up: {metas}")

        logs = {node: await committed_log(client, node) for node in cluster.ids}
        shortest = min(len(log) for log in logs.values())
        prefixes = {node: log[:shortest] for node, log in logs.items()}
        assert prefixes["n0"] == prefixes["n1"] == prefixes["n2"], "committed prefixes differ"
        by_index = {index: body for index, _, body, _ in logs[new_leader]}
        missing = [i for i, body in acked.items() if by_index.get(i) != body]
        assert not missing, f"{len(missing)} acknowledged entries missing, e.g. {missing[:5]}"
        # The client retried appends whose answer the kill swallowed; being
        # idempotent, none of them may be in the log twice.
        # (Only this test's entries: the broker on the same log writes its own.)
        counts = Counter(body for _, _, body, _ in logs[new_leader]
                         if body.startswith((b"entry-", b"trickle-", b"final")))
        duplicated = [body for body, count in counts.items() if count > 1]
        assert not duplicated, f"{len(duplicated)} entries appended twice, e.g. {duplicated[:3]}"
        print(f"failover: first append acknowledged {failover_s * 1000:.0f} ms after SIGKILL")
    finally:
        await client.close()
        cluster.stop_all()
