"""Membership changes on real node processes, under load: grow three nodes to
five (a fourth, then a fifth whose learner entry is still uncommitted when
the leader is SIGKILLed), then remove two of the original three (the dead
one first: the "replace a dead node" walkthrough). Throughout, a client appends; at the end
every acknowledged entry is on every current member and their logs are
identical. The CLI's `member list --json` shape is checked on the way."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.process_cluster import ROOT, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def committed_log(client: DLedgerClient, node: str) -> list[tuple[int, int, bytes, int]]:
    return [(e.index, e.term, e.body, e.chain_crc) async for e in client.read(from_id=node)]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


async def wait_committed_everywhere(client: DLedgerClient, nodes: list[str], index: int,
                                    timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = {r["id"]: r for r in await client.cluster_status()}
        if all(n in rows and (rows[n].get("committed_index") or -1) >= index for n in nodes):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not committed to {index} everywhere: "
                                 f"{ {n: rows.get(n, {}).get('committed_index') for n in nodes} }")
        await asyncio.sleep(0.1)


async def test_grow_to_five_kill_the_leader_mid_change_remove_two_originals(tmp_path: Path):
    cluster = ProcessCluster(tmp_path, extra_args=["--data-file-size", str(1 << 20),
                                                   "--max-entry-size", str(64 << 10)])
    cluster.start()
    client = DLedgerClient(list(cluster.addresses.values()), deadline_s=20.0)
    admin = DLedgerClient(list(cluster.addresses.values()), deadline_s=20.0)
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()
    failures = [0]

    async def writer(worker: int) -> None:
        n = 0
        while not stop.is_set():
            bodies = [f"w{worker}-{n}-{i}".encode() for i in range(10)]
            n += 1
            try:
                result = await client.append(bodies)
            except DLedgerError:
                failures[0] += 1   # outcome unknown: it may or may not be in the log
                continue
            for offset, body in enumerate(bodies):
                acked[result.first_index + offset] = body

    writers = [asyncio.ensure_future(writer(w)) for w in range(4)]
    try:
        started = time.monotonic()
        leader = await find_leader(client, list(cluster.addresses.values()))
        await asyncio.sleep(0.5)

        # A fourth node: learner, caught up under load, promoted.
        # (Through the CLI, which waits for the promotion.)
        address = cluster.add_node("n3", members=["n0", "n1", "n2"])
        added = await asyncio.to_thread(cli, "member", "add", "--servers", cluster.addresses["n0"], "--id", "n3",
                                        "--address", address, "--json")
        assert added.returncode == 0, added.stderr
        assert {m["id"]: m["role"] for m in json.loads(added.stdout)["members"]}["n3"] == "voter"

        # A fifth, and the leader dies with the change uncommitted: two
        # followers are paused, so the learner entry reaches only the third
        # (2 of 4 voters), then the leader is killed and the others resumed.
        # Only that third follower can win (it holds the longest log); it keeps
        # the change, commits it, and the client's retry finds it done.
        leader = await find_leader(client, list(cluster.addresses.values()))
        paused = [n for n in ("n0", "n1", "n2", "n3") if n != leader][:2]
        keeper = next(n for n in ("n0", "n1", "n2", "n3") if n not in (leader, *paused))
        for node in paused:
            cluster.pause(node)
        address = cluster.add_node("n4", members=["n0", "n1", "n2", "n3"])
        adding = asyncio.ensure_future(admin.add_member("n4", address, timeout_s=30.0))
        deadline = time.monotonic() + 10
        while True:
            meta = await client.metadata(cluster.addresses[keeper])
            if meta is not None and "n4" in {p.id for p in meta.peers}:
                break
            assert time.monotonic() < deadline, "the learner entry did not reach the third follower"
            await asyncio.sleep(0.02)
        meta = await client.metadata(cluster.addresses[keeper])
        assert meta is not None and meta.committed_index < meta.ledger_end_index   # still uncommitted
        cluster.kill(leader)
        for node in paused:
            cluster.resume(node)
        members = await adding
        assert {m["id"]: m["role"] for m in members} == {"n0": "voter", "n1": "voter", "n2": "voter",
                                                         "n3": "voter", "n4": "voter"}
        # The keeper, or a paused follower: the pushes of the learner entry to
        # a paused follower wait in its socket's receive buffer (the kernel
        # accepts them), and a follower resumed after the kill still reads and
        # appends them, as a network delivers what a dead sender sent. Either
        # way the winner holds the change (above: committed, all five voters).
        assert await find_leader(client, [cluster.addresses[n] for n in cluster.ids if cluster.running(n)]) \
            in (keeper, *paused)

        # Replace the dead node: it is removed while down (n3 and n4 took its place).
        dead = leader if leader in ("n0", "n1", "n2") else "n0"
        if dead != leader:
            cluster.kill(dead)
            cluster.start(leader)   # n3 stays a member: it comes back and catches up
        live = [cluster.addresses[n] for n in cluster.ids if cluster.running(n)]
        removed = await asyncio.to_thread(cli, "member", "remove", "--servers", ",".join(live), "--id", dead, "--json")
        assert removed.returncode == 0, removed.stderr
        assert dead not in {m["id"] for m in json.loads(removed.stdout)["members"]}

        # Remove a second original, live one (even if it leads now), then stop it.
        second = next(n for n in ("n0", "n1", "n2") if n != dead)
        members = await admin.remove_member(second)
        current = sorted(m["id"] for m in members)
        assert second not in current and len(current) == 3
        await asyncio.sleep(1.0)   # a leader that removed itself steps down; appends go on
        cluster.stop_node(second)
        await asyncio.sleep(0.5)

        listed = cli("member", "list", "--servers", ",".join(cluster.addresses[n] for n in current), "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == {"members": [
            {"id": n, "address": cluster.addresses[n], "role": "voter"} for n in
            [m["id"] for m in members]]}

        stop.set()
        await asyncio.gather(*writers)
        final = await client.append([b"final"])
        acked[final.first_index] = b"final"
        await wait_committed_everywhere(client, current, final.first_index)

        logs = {n: await committed_log(client, n) for n in current}
        reference = logs[current[0]]
        for n in current:
            assert logs[n] == reference, f"{n}'s committed log differs from {current[0]}'s"
        held = {index: body for index, _, body, _ in reference}
        missing = [i for i, body in acked.items() if held.get(i) != body]
        assert not missing, f"{len(missing)} acknowledged entries missing, e.g. {missing[:5]}"
        assert len(acked) > 1000, f"only {len(acked)} entries acknowledged under load"
        print(f"membership under load: {len(acked)} entries acknowledged, {failures[0]} appends with an "
              f"unknown outcome, {time.monotonic() - started:.1f} s")
    finally:
        stop.set()
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        await client.close()
        await admin.close()
        cluster.kill_all()


async def test_replacing_dead_nodes_at_new_addresses_as_the_operations_guide_says(tmp_path: Path):
    """docs/operations.md, "Replacing a node", command for command: a dead
    member's machine is replaced at a new address under the same id (a new,
    empty disk), then another dead member by a server under a new id. After
    each, the replacement holds the whole log and counts in the quorum."""
    cluster = ProcessCluster(tmp_path, spares=1, alternates=True)
    cluster.start()
    client = DLedgerClient(cluster.every_address, deadline_s=20.0)
    try:
        leader = await find_leader(client, list(cluster.addresses.values()))
        acked = [(await client.append([f"before-{i}".encode()])).first_index for i in range(30)]
        dead = next(n for n in cluster.ids if n != leader)
        cluster.kill(dead)
        cluster.wipe(dead)                        # the machine is gone, and its disk with it
        # `dledger node --id n1 --peers <members, n1 at its new address> --join --data-dir <empty>`
        address = cluster.move_node(dead, [n for n in cluster.ids if n != dead])
        servers = ",".join(cluster.addresses[n] for n in cluster.ids if n != dead)
        moved = await asyncio.to_thread(cli, "member", "replace", "--servers", servers, "--id", dead,
                                        "--address", address, "--json")
        assert moved.returncode == 0, moved.stderr
        assert {m["id"]: (m["address"], m["role"]) for m in json.loads(moved.stdout)["members"]}[dead] == \
            (address, "voter")
        # It catches up and counts: with the third member down, it makes the
        # majority. Until it has caught up it counts toward no quorum (the
        # guide: the group tolerates what it tolerated while it was dead), so
        # the third goes down only then (a new process can take a second to
        # start on a loaded machine; killed sooner, the leader stepped down).
        rows = {r["id"]: r for r in await client.cluster_status()}
        await wait_committed_everywhere(client, [dead], rows[leader]["committed_index"])
        third = next(n for n in cluster.ids if n not in (leader, dead))
        cluster.kill(third)
        acked.append((await client.append([b"counted by the moved member"])).first_index)
        await wait_committed_everywhere(client, [leader, dead], acked[-1])
        cluster.start(third)

        # Another dead member, replaced by a server under a new id (added and
        # promoted first, then the dead one removed).
        gone = third
        cluster.kill(gone)
        new = cluster.free_slots()[0]
        new_address = cluster.add_node(new, [n for n in cluster.ids if n not in (gone, new)])
        servers = ",".join(cluster.addresses[n] for n in (leader, dead))
        replaced = await asyncio.to_thread(cli, "member", "replace", "--servers", servers, "--id", gone,
                                           "--new-id", new, "--address", new_address, "--json")
        assert replaced.returncode == 0, replaced.stderr
        assert sorted(m["id"] for m in json.loads(replaced.stdout)["members"]) == sorted([leader, dead, new])
        cluster.ids.remove(gone)
        acked.append((await client.append([b"after both replacements"])).first_index)
        await wait_committed_everywhere(client, [leader, dead, new], acked[-1])
        logs = {n: await committed_log(client, n) for n in (leader, dead, new)}
        assert logs[dead] == logs[leader] == logs[new]
        held = {index for index, _, _, _ in logs[leader]}
        assert set(acked) <= held
    finally:
        await client.close()
        cluster.kill_all()
