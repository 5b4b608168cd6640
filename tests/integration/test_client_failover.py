"""broker.client across a leader SIGKILL: producers keep sending through the
election (their retries carry the same message ids), every acknowledged
message is in the committed log exactly where its receipt says, and no
message is stored twice."""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from broker.client import AdminClient, ClientError, Message, Producer, SendReceipt
from cluster.process_cluster import ProcessCluster
from tests.integration.broker_cluster import leader_of, servers, stored_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SENDERS = 8
BEFORE_KILL_S = 1.5
AFTER_KILL_S = 4.0


@pytest.fixture
def cluster(tmp_path):
    c = ProcessCluster(tmp_path / "failover")
    c.start()
    yield c
    c.stop_all()


async def test_sends_go_on_across_a_leader_sigkill_without_loss_or_duplicates(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic("Failover", 4)
    acked: dict[str, tuple[bytes, SendReceipt, float]] = {}
    failures: list[ClientError] = []
    stop_at = time.monotonic() + 60.0

    async def sender(producer: Producer, worker: int) -> None:
        sequence = 0
        while time.monotonic() < stop_at:
            body = f"{worker}:{sequence}".encode()
            sequence += 1
            try:
                receipt = await producer.send(Message("Failover", body))
            except ClientError as error:  # past the client's deadline: counted, not hidden
                failures.append(error)
                continue
            acked[receipt.message_id] = (body, receipt, time.monotonic())

    async with Producer(servers(cluster)) as producer:
        senders = [asyncio.ensure_future(sender(producer, w)) for w in range(SENDERS)]
        await asyncio.sleep(BEFORE_KILL_S)
        leader = await leader_of(cluster)
        cluster.kill(leader)
        killed_at = time.monotonic()
        await asyncio.sleep(AFTER_KILL_S)
        stop_at = 0.0
        await asyncio.gather(*senders)
        retried = producer.connection.retries

    assert retried > 0, "no send was retried: the kill did not hit a send in flight"
    assert not failures, failures[:3]
    assert sum(1 for _, _, at in acked.values() if at > killed_at + 1.0) > 0, "no send succeeded after the kill"
    stored = await stored_messages(cluster, "Failover")
    counts = Counter(m.message_id for m in stored)
    assert [mid for mid, n in counts.items() if n > 1] == [], "a message was stored twice"
    by_id = {m.message_id: m for m in stored}
    missing = [mid for mid in acked if mid not in by_id]
    assert missing == [], f"{len(missing)} acknowledged messages lost"
    for message_id, (body, receipt, _) in acked.items():
        message = by_id[message_id]
        assert (message.body, message.queue_id, message.queue_offset) == (body, receipt.queue_id, receipt.offset)
