"""A cluster whose derived state is big stays stable: 120,000 pending timers
(delayed messages due in an hour) cost the leader nothing of its term.

Every node rewrites its timers.json every few seconds while timers arrive.
Encoded on the event loop, 100,000 timers held it for over a second, longer
than a follower waits for a heartbeat: leaders were elected again and again
while delayed messages were sent. Real node processes, so that one node's
stall is not every node's."""
from __future__ import annotations

import asyncio
import json

import pytest

from broker.client import AdminClient, Message, Producer
from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TIMERS = 120_000
BATCH = 200
SENDERS = 6
# The store rewrites changed state files every 5 s: a few rounds.
SAVED_WAIT_S = 60.0


@pytest.fixture
def cluster(tmp_path):
    c = ProcessCluster(tmp_path / "big", extra_args=SPARSE_FILES)
    c.start()
    yield c
    c.stop_all()


async def terms(cluster: ProcessCluster) -> dict[str, tuple[int, str] | None]:
    """Each node's (term, leader) as it reports them; None: it did not answer
    within the client's probe timeout."""
    async with DLedgerClient(list(cluster.addresses.values())) as client:
        found: dict[str, tuple[int, str] | None] = {}
        for node, address in cluster.addresses.items():
            meta = await client.metadata(address)
            found[node] = (meta.term, meta.leader_id) if meta is not None else None
        return found


async def agreed_terms(cluster: ProcessCluster, leader: str, timeout_s: float = 10.0) -> dict[str, tuple[int, str]]:
    """terms() once every node answers and knows the leader (a follower that
    has not had its first heartbeat yet reports term 0 and no leader; a node
    just started on a busy machine may miss a probe's timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(set((found := await terms(cluster)).values())) != 1 or found[leader] is None \
            or found[leader][1] != leader:
        assert loop.time() < deadline, f"the nodes do not agree on a leader: {found}"
        await asyncio.sleep(0.2)
    return found  # type: ignore[return-value]


async def test_a_hundred_thousand_pending_timers_do_not_cost_the_leader_its_term(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic("Later", 8, "delay")
    leader = await leader_of(cluster)
    before = await agreed_terms(cluster, leader)
    batches = iter(range(0, TIMERS, BATCH))
    async with Producer(servers(cluster)) as producer:

        async def sender() -> None:
            for start in batches:
                await producer.send_batch([Message("Later", b"%d" % (start + i), delay=3600) for i in range(BATCH)])

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
    # Every node's file comes to hold them all: a rewrite of the whole state
    # once it has applied the last entries (a follower on a busy machine
    # applies them later than the leader, so its next rewrite comes later).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SAVED_WAIT_S
    while (saved := saved_counts(cluster)) != {node: TIMERS for node in cluster.addresses} \
            and loop.time() < deadline:
        await asyncio.sleep(1.0)
    after = await agreed_terms(cluster, leader)   # waits out a missed probe, not a leader change
    assert cluster.exited() == {}
    assert after == before == {node: (before[leader][0], leader) for node in cluster.addresses}, \
        f"leadership moved while timers piled up: {before} -> {after}"
    assert saved == {node: TIMERS for node in cluster.addresses}


def saved_counts(cluster: ProcessCluster) -> dict[str, int]:
    """How many timers each node's timers.json holds (0 while there is none:
    a rewrite moves the old file aside a moment before the new one lands)."""
    counts = {}
    for node in cluster.addresses:
        try:
            text = (cluster.base / node / "store" / "config" / "timers.json").read_text()
        except FileNotFoundError:
            counts[node] = 0
        else:
            counts[node] = json.loads(text)["timers"]["count"]
    return counts
