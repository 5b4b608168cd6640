"""deploy/docker-compose.yml end to end, with real containers killed and cut
off for real: build the image (offline, from wheels), bring three nodes up,
write through the published ports, `docker kill` the leader, write more,
start it again, and check that every node's committed log holds everything
acknowledged, once, identically; then `docker network disconnect` the new
leader, check that a new one takes over while the cut-off one acknowledges
nothing, reconnect it and check that it rejoins and converges.

Prints the durations (image build, start to healthy, failover seen through
the published ports, ...) as one JSON line.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterator

import pytest

from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from store.codec import MESSAGE_MAGIC_CODES, peek_magic
from store.system_entry import SYSTEM_MAGIC_CODE
from tests.docker.compose import (NODE_IDS, SMALL_SEGMENTS, BuiltImage, ComposeProject, docker_unavailable_reason)

SKIP_REASON = docker_unavailable_reason()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"docker end-to-end test skipped: {SKIP_REASON}"),
    # A cold machine builds the base image from Debian packages first (about a minute).
    pytest.mark.timeout(900),
]

ENTRIES_PER_PHASE = 1000
ENTRIES_PER_CALL = 10
# After a kill or a reconnect a peer's gRPC channel may wait out its DNS
# re-resolution backoff (gRPC's own, up to tens of seconds) before it reaches
# the returning node again.
CONVERGE_TIMEOUT_S = 120.0
# The append sent to a cut-off leader must not succeed; this bounds the wait.
CUT_OFF_APPEND_TIMEOUT_S = 60.0
UNKNOWN_OUTCOME = {ResponseCode.TERM_CHANGED, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TIMEOUT}

LogEntry = tuple[int, int, bytes, int]  # index, term, body, chain CRC

# Run inside the container of the leader about to be cut off: ready before the
# cut (imports done), it sends one append to the node's own port the moment
# the container's network interface disappears, while the node still
# believes it leads, and prints the outcome as JSON.
APPEND_AT_THE_CUT = """
import asyncio, json, os, sys
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

async def main(body):
    print("ready", flush=True)
    while set(os.listdir("/sys/class/net")) - {"lo"}:
        await asyncio.sleep(0.005)
    async with DLedgerClient(["127.0.0.1:20911"], deadline_s=10.0) as client:
        try:
            result = await client.append([body])
            print(json.dumps({"acked": True, "index": result.first_index}))
        except DLedgerError as error:
            print(json.dumps({"acked": False, "error": str(error)}))

asyncio.run(main(sys.argv[1].encode()))
"""


@dataclass
class Produced:
    """What a workload run got acknowledged, and what may or may not have been
    stored (an append whose answer was lost: not acknowledged, not an error)."""
    acked: dict[int, bytes] = field(default_factory=dict)
    uncertain: set[bytes] = field(default_factory=set)
    first_ack_at: float | None = None


async def produce(client: DLedgerClient, tag: str, count: int) -> Produced:
    """The workload: `count` entries with unique bodies, ENTRIES_PER_CALL per
    append. (When the broker lands this becomes `count` messages.)"""
    produced = Produced()
    for first in range(0, count, ENTRIES_PER_CALL):
        bodies = [f"{tag}-{i:05d}".encode() for i in range(first, min(count, first + ENTRIES_PER_CALL))]
        try:
            result = await client.append(bodies)
        except DLedgerError as error:
            if error.code not in UNKNOWN_OUTCOME:
                raise
            produced.uncertain.update(bodies)
            continue
        produced.first_ack_at = produced.first_ack_at or time.monotonic()
        produced.acked.update(zip(range(result.first_index, result.last_index + 1), bodies))
    return produced


async def committed_log(client: DLedgerClient, node: str) -> list[LogEntry]:
    return [(e.index, e.term, e.body, e.chain_crc) async for e in client.read(from_id=node)]


async def leader_other_than(client: DLedgerClient, servers: list[str], excluded: str | None,
                            timeout_s: float = 30.0) -> str:
    """The id of a node that says it leads, other than `excluded`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for server in servers:
            meta = await client.metadata(server)
            if meta is not None and meta.role == "LEADER" and meta.self_id != excluded:
                return meta.self_id
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no leader other than {excluded} within {timeout_s} s")


async def wait_converged(client: DLedgerClient, servers: list[str]) -> float:
    """Seconds until all three nodes answer, one leads, and every node has
    committed its whole log, the same length everywhere."""
    started = time.monotonic()
    views: list[object] = []
    while time.monotonic() - started < CONVERGE_TIMEOUT_S:
        views = [await client.metadata(server) for server in servers]
        if all(v is not None for v in views):
            roles = sorted(v.role for v in views)
            indexes = {(v.ledger_end_index, v.committed_index) for v in views}
            (end, committed), *others = indexes
            if roles == ["FOLLOWER", "FOLLOWER", "LEADER"] and not others and end == committed:
                return time.monotonic() - started
        await asyncio.sleep(0.2)
    raise AssertionError(f"nodes did not converge within {CONVERGE_TIMEOUT_S} s: {views}")


def is_store_entry(body: bytes) -> bool:
    return len(body) >= 8 and peek_magic(body) in (*MESSAGE_MAGIC_CODES, SYSTEM_MAGIC_CODE)


async def check_replicas(client: DLedgerClient, produced: list[Produced], absent: Collection[bytes] = ()) -> int:
    """Every node's committed log is the same; it holds every acknowledged
    entry at its index, no body twice, nothing nobody appended and none of
    `absent`. Returns the number of entries."""
    logs = {node: await committed_log(client, node) for node in NODE_IDS}
    reference = logs[NODE_IDS[0]]
    for node, log in logs.items():
        assert log == reference, f"{node}'s committed log differs from {NODE_IDS[0]}'s"
    by_index = {index: body for index, _, body, _ in reference}
    # The broker on the same log writes entries of its own (messages, system
    # entries); the checks below are about the entries this test appended.
    bodies = [body for _, _, body, _ in reference if body and not is_store_entry(body)]
    acked = {index: body for p in produced for index, body in p.acked.items()}
    lost = [index for index, body in acked.items() if by_index.get(index) != body]
    assert not lost, f"{len(lost)} acknowledged entries lost, e.g. at {lost[:5]}"
    duplicated = [body for body, times in Counter(bodies).items() if times > 1]
    assert not duplicated, f"{len(duplicated)} bodies stored twice, e.g. {sorted(duplicated)[:3]}"
    allowed = set(acked.values()).union(*(p.uncertain for p in produced))
    unexpected = [body for body in bodies if body not in allowed]
    assert not unexpected, f"entries nobody appended: {unexpected[:3]}"
    stored_absent = set(absent).intersection(bodies)
    assert not stored_absent, f"committed although never acknowledged: {sorted(stored_absent)}"
    return len(reference)


@pytest.fixture
def project(image: BuiltImage, tmp_path: Path) -> Iterator[ComposeProject]:
    with ComposeProject(image.tag, node_env=SMALL_SEGMENTS, override_dir=tmp_path).running() as cluster:
        yield cluster


async def kill_the_leader(project: ComposeProject, client: DLedgerClient,
                          timings: dict[str, float]) -> tuple[str, list[Produced]]:
    """Write, `docker kill` the leader's container, write on, start it again
    and wait until it has caught up; returns the killed node and the writes."""
    servers = project.servers
    first = await produce(client, "before-kill", ENTRIES_PER_PHASE)
    assert first.acked, "a healthy cluster acknowledged nothing"
    killed = await leader_other_than(client, servers, None)
    killed_at = time.monotonic()
    project.kill(killed)
    second = await produce(client, "after-kill", ENTRIES_PER_PHASE)
    assert second.first_ack_at is not None, "no append was acknowledged after the kill"
    timings["failover_s"] = second.first_ack_at - killed_at
    project.start(killed)
    timings["killed_node_rejoin_s"] = await wait_converged(client, servers)
    return killed, [first, second]


async def cut_off_the_leader(project: ComposeProject, client: DLedgerClient,
                             timings: dict[str, float]) -> tuple[str, dict[str, object], Produced]:
    """`docker network disconnect` the leader: a new leader must take over
    while an append sent straight to the old one fails; then reconnect it and
    wait until it has caught up. Returns the node, the append's outcome and
    what the majority acknowledged meanwhile."""
    servers = project.servers
    cut = await leader_other_than(client, servers, None)
    network = project.network(cut)
    marker = f"sent-to-cut-off-{cut}"
    with project.exec_background(cut, "python", "-c", APPEND_AT_THE_CUT, marker) as probe:
        cut_at = time.monotonic()
        project.disconnect(cut)
        survivors = [server for node, server in zip(NODE_IDS, servers) if node != cut]
        await leader_other_than(client, survivors, cut)
        timings["cut_off_new_leader_s"] = time.monotonic() - cut_at
        outcome = json.loads(probe.communicate(timeout=CUT_OFF_APPEND_TIMEOUT_S)[0].splitlines()[-1])
    assert not outcome["acked"], f"the cut-off node {cut} acknowledged an append: {outcome}"
    outcome["marker"] = marker
    meanwhile = await produce(client, "while-cut-off", ENTRIES_PER_PHASE // 10)
    assert meanwhile.acked, "the majority side acknowledged nothing"
    project.reconnect(cut, network)
    timings["cut_off_node_rejoin_s"] = await wait_converged(client, servers)
    return cut, outcome, meanwhile


async def test_compose_cluster_survives_a_killed_and_a_cut_off_leader(
        image: BuiltImage, project: ComposeProject, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    timings = {"image_build_s": image.build_s, "healthy_s": project.wait_healthy()}
    async with DLedgerClient(project.servers, deadline_s=30.0) as client:
        killed, produced = await kill_the_leader(project, client, timings)
        await check_replicas(client, produced)
        cut, outcome, meanwhile = await cut_off_the_leader(project, client, timings)
        # The cut-off leader may have stored the append it could not commit:
        # its rejoin must have cut that entry away.
        entries = await check_replicas(client, produced + [meanwhile], absent={str(outcome["marker"]).encode()})
        # The host client reached the leaders' client links through their published ports.
        assert client.appends_by_path["link"] > 0, client.appends_by_path
    timings["test_s"] = time.monotonic() - started
    timings["total_s"] = timings["test_s"] + image.build_s
    uncertain = sum(len(p.uncertain) for p in produced + [meanwhile])
    report = {"killed": killed, "cut_off": cut, "entries": entries, "uncertain_appends": uncertain,
              "appends_by_path": client.appends_by_path,
              "cut_off_append": outcome["error"],
              **{name: round(seconds, 2) for name, seconds in timings.items()}}
    with capsys.disabled():
        print(f"\ndocker e2e: {json.dumps(report)}")
