"""Pending timers and undecided transactions travel in the store's metadata
snapshot: a replica whose log begins after the timer and half messages
(retention, a new disk) learns them from the snapshot entry alone."""
from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from broker.timer.state import TimerState
from broker.transaction.state import TransactionState
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.metadata_snapshot import MetadataSnapshotHandler, snapshot_payload
from store.system_entry import SystemKind
from tests.unit.broker_harness import BrokerCluster, protocol_message

pytestmark = pytest.mark.timeout(60)


async def test_a_replica_starting_from_a_snapshot_knows_every_pending_timer_and_half_message(tmp_path):
    cluster = BrokerCluster(str(tmp_path / "cluster"))
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=2)
        broker = await cluster.leader_broker()
        due = Timestamp()
        due.FromMilliseconds(cluster.clock() + 3_600_000)
        await broker.sender.send([protocol_message("T", b"later", delivery_timestamp=due, message_type=pb.DELAY),
                                  protocol_message("T", b"level", user={"DELAY": "5"})])
        await broker.sender.send([protocol_message("T", b"half", message_type=pb.TRANSACTION)])
        await cluster.wait_applied()
        payload = snapshot_payload(broker.store.managers)
    finally:
        await cluster.stop()
    timers = TimerState(str(tmp_path / "fresh"), broker.timers.levels)
    transactions = TransactionState(str(tmp_path / "fresh"), 6_000)
    MetadataSnapshotHandler([timers, transactions]).apply(10_000, SystemKind.METADATA_SNAPSHOT, payload)
    assert timers.pending == broker.timers.state.pending and len(timers) == 2
    assert timers.next_due_ms() == broker.timers.state.next_due_ms()
    assert transactions.halves == broker.transactions.state.halves and len(transactions.halves) == 1
    assert timers.applied_index == transactions.applied_index == 10_000
