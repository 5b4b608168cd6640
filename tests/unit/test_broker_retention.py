"""Pending timers and undecided half messages under log retention: they stay
out of the store's metadata snapshots (too many for one entry) and the log is
kept from the oldest of them instead, so a replica with a new disk derives
them by replaying the log, and retention moves on once they are done."""
from __future__ import annotations

import asyncio
import os
import shutil

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.metadata_snapshot import capture_payload
from tests.unit.broker_harness import BrokerCluster, protocol_message
from tests.unit.store_harness import message

pytestmark = pytest.mark.timeout(90)
RETAIN_NOTHING = dict(data_file_size=16 * 1024, max_entry_size=8 * 1024, retention_s=0.0,
                      retention_check_interval_s=0.2, store={"clean_interval_s": 0.2})


async def fill(cluster: BrokerCluster, rounds: int) -> None:
    """Enough messages to roll segments, then a metadata snapshot (retention
    never deletes the latest one)."""
    store = await cluster.leader_store()
    for _ in range(rounds):
        await store.put_messages([message("Filler", os.urandom(1000)) for _ in range(4)])
    assert await store.write_metadata_snapshot()


async def begin_index_settles(cluster: BrokerCluster) -> int:
    """The leader's first retained entry once retention has had its turns."""
    leader = cluster.servers[await cluster.wait_leader()]
    last, stable = -1, 0
    while stable < 5:
        await asyncio.sleep(0.2)
        begin = leader.store.ledger_begin_index
        stable, last = (stable + 1, begin) if begin == last else (0, begin)
    return last


async def test_retention_keeps_pending_timers_and_halves_which_a_new_disk_derives_by_replay(tmp_path):
    cluster = BrokerCluster(str(tmp_path), **RETAIN_NOTHING)
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=2)
        await cluster.create_topic("Filler", queues=1)
        await fill(cluster, 12)
        broker = await cluster.leader_broker()
        assert set(capture_payload(broker.store.managers)()["managers"]).isdisjoint({"timers.json", "transactions.json"})
        due = Timestamp()
        due.FromMilliseconds(cluster.clock() + 3_600_000)
        await broker.sender.send([protocol_message("T", b"later", delivery_timestamp=due, message_type=pb.DELAY)])
        half = (await broker.sender.send([protocol_message("T", b"half", message_type=pb.TRANSACTION)])).entries[0]
        await cluster.wait_applied()
        pending_from = min(broker.timers.state.oldest_index(), broker.transactions.state.oldest_index())
        await fill(cluster, 12)
        begin = await begin_index_settles(cluster)
        assert 0 < begin <= pending_from, (begin, pending_from)

        leader = await cluster.wait_leader()
        victim = next(n for n in cluster.servers if n != leader)
        await cluster.stop(victim)
        shutil.rmtree(cluster.configs[victim].data_dir)  # a new disk
        await cluster.start(victim)
        await cluster.wait_applied(timeout=15)
        fresh = cluster.brokers[victim]
        assert fresh.timers.state.pending == broker.timers.state.pending and len(fresh.timers.state) == 1
        assert fresh.transactions.state.halves == broker.transactions.state.halves

        broker = await cluster.leader_broker()
        await broker.transactions.end(spb.EndTransactionRequest(
            topic=pb.Resource(name="T"), message_id=half.message_id, transaction_id=half.transaction_id,
            resolution=pb.COMMIT, source=pb.SOURCE_CLIENT))
        cluster.clock.advance(3_600_000)
        await cluster.eventually(lambda: all(len(b.timers.state) == 0 for b in cluster.brokers.values()),
                                 what="the timer delivered")
        await fill(cluster, 12)
        assert await begin_index_settles(cluster) > pending_from, "retention still held by done messages"
    finally:
        await cluster.stop()
