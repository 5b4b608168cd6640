"""A producer's Telemetry stream, relayed by a follower, follows the leader:
after the leader is SIGKILLed the new leader knows the producer at once and
checks an undecided transaction back through the same, still open, stream
(the official client would otherwise re-send its settings only after 300 s)."""
from __future__ import annotations

import asyncio

import pytest

from cluster.process_cluster import ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from tests.integration.broker_helpers import TelemetryProducer, leader_of, message, recovery, send, stubs_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_a_relayed_producer_session_moves_to_the_new_leader(tmp_path):
    cluster = ProcessCluster(tmp_path)
    cluster.start()
    channels, by_node = stubs_of(cluster.addresses)
    producer = None
    try:
        leader = await leader_of(cluster)
        relay = next(n for n in cluster.ids if n != leader)
        producer = TelemetryProducer(by_node[relay], "relayed-producer@1", ["Relayed"])
        await asyncio.wait_for(producer.settled.wait(), 15)
        cluster.kill(leader)
        survivor = next(n for n in cluster.ids if n not in (leader, relay))
        half = message("Relayed", b"decide me", message_type=pb.TRANSACTION,
                       orphaned_transaction_recovery_duration=recovery(1))
        sent = await send(by_node[survivor], half)
        assert sent.status.code == pb.OK, sent.status
        check = await producer.check(timeout=30)
        assert check.transaction_id == sent.entries[0].transaction_id
    finally:
        if producer is not None:
            await producer.close()
        for channel in channels.values():
            await channel.close()
        cluster.stop_all()

