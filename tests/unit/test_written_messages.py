"""The leader's apply loop takes what its own put wrote (store/commit_log.py,
DLedgerCommitLog.written) instead of parsing the entries back: it must derive
exactly what a follower derives by parsing, and must never take what it
holds for an entry that is not the very one it wrote (another term or other
bytes at the same position). A put that fails leaves nothing to take:
tests/unit/test_hot_messages.py, test_a_message_not_committed_is_not_held."""
from __future__ import annotations

import dataclasses

import pytest

from store.codec import DispatchRequest
from tests.unit.store_harness import StoreCluster, message
from tests.unit.test_hot_messages import varied

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = StoreCluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


def record_arrivals(cluster: StoreCluster) -> dict[str, list[tuple[int, DispatchRequest]]]:
    seen: dict[str, list[tuple[int, DispatchRequest]]] = {}
    for node, store in cluster.stores.items():
        arrivals = seen.setdefault(node, [])
        store.reput.listeners.append(lambda request, index, arrivals=arrivals: arrivals.append((index, request)))
    return seen


def count_parses(store) -> list[int]:
    parsed: list[int] = []
    reput = store.reput
    original = reput._dispatch_message

    def counting(index, pos, body):
        parsed.append(index)
        original(index, pos, body)
    reput._dispatch_message = counting
    return parsed


async def test_the_leader_derives_from_what_it_wrote_exactly_what_followers_parse(cluster: StoreCluster):
    await cluster.create_topic("Hot", queues=4)
    await cluster.create_topic("L" * 200, queues=1)
    leader_id = await cluster.wait_leader()
    leader = cluster.stores[leader_id]
    await cluster.wait_applied()
    seen = record_arrivals(cluster)
    parsed = count_parses(leader)
    results = await leader.put_messages(varied())
    results += await leader.put_messages([message("Hot", b"m%d" % i, queue_id=i % 4, tags="T%d" % (i % 3),
                                                  keys="k%d" % i, uniq_key="U%d" % i) for i in range(40)])
    await cluster.wait_applied()
    assert parsed == [] and leader.commit_log.written == {}
    expected = seen[leader_id]
    assert [index for index, _ in expected] == [r.index for r in results]
    for node, arrivals in seen.items():
        assert arrivals == expected, node
    # What the ConsumeQueues and the index say agrees too.
    for store in cluster.stores.values():
        assert [m.body for m in store.get_messages("Hot", 2, 0, 100).messages] == \
            [b"from an IPv6 producer"] + [b"m%d" % i for i in range(2, 40, 4)]
        assert [m.body for m in store.query_messages("Hot", "k7", 10, 0, 1 << 62)] == [b"m7"]


async def test_an_entry_of_another_term_or_other_bytes_at_the_position_is_parsed(cluster: StoreCluster, monkeypatch):
    """What the leader left for a position is taken only for the entry it
    wrote: here its record says another term for one entry and other bytes
    for another, and claims a topic nobody wrote; the apply loop parses
    those two and derives the truth on every replica."""
    await cluster.create_topic("Hot", queues=1)
    leader_id = await cluster.wait_leader()
    leader = cluster.stores[leader_id]
    await cluster.wait_applied()
    seen = record_arrivals(cluster)
    parsed = count_parses(leader)
    written = leader.commit_log.written
    server = leader.commit_log.server
    append = server.append

    async def tampering_append(bodies, prepare=None, **kwargs):
        def place(positions):
            prepare(positions)
            for position, tamper in zip(positions, (lambda t, c: (t + 1, c), lambda t, c: (t, c ^ 1))):
                term, crc, request = written[position]
                written[position] = (*tamper(term, crc), dataclasses.replace(request, topic="Bogus"))
        return await append(bodies, prepare=place, **kwargs)
    monkeypatch.setattr(server, "append", tampering_append)
    results = await leader.put_messages([message("Hot", b"m%d" % i, uniq_key="U%d" % i) for i in range(3)])
    await cluster.wait_applied()
    assert parsed == [r.index for r in results[:2]]
    for node, arrivals in seen.items():
        assert [request.topic for _, request in arrivals] == ["Hot"] * 3, node
        assert arrivals == seen[leader_id]
    assert [m.body for m in leader.get_messages("Hot", 0, 0, 10).messages] == [b"m0", b"m1", b"m2"]
    assert written == {}

