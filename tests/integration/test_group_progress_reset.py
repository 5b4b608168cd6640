"""Consumer progress and offset reset on three real node processes: progress
per queue (committed offset, lag, in flight, retries, last consume time), a
reset by time that a connected consumer follows without a restart, resets to
earliest, latest and one queue offset, a reset that survives a leader kill,
and dead letters listed and sent back to the group."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from broker.client import AdminClient, BadRequestError, ClientError, Message, NotFoundError, Producer, SimpleConsumer
from broker.client.operations import OperationsClient
from cluster.process_cluster import ROOT, ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC, GROUP = "Payments", "Accounting"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("reset"), extra_args=[*SPARSE_FILES])
    c.start()
    yield c
    c.stop_all()


async def _send(cluster, topic: str, first: int, count: int) -> list:
    async with Producer(servers(cluster)) as producer:
        return [await producer.send(Message(topic, f"pay-{i}".encode(), keys=[f"p{i}"]))
                for i in range(first, first + count)]


async def _drain(consumer: SimpleConsumer, count: int, ack: bool = True) -> list:
    got: list = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        received = await consumer.receive(32, 30, await_duration_s=1)
        if ack and received:
            await consumer.ack(*received)
        got.extend(received)
    return got


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)


async def test_a_reset_by_time_moves_a_connected_consumer_and_survives_a_leader_kill(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(TOPIC, 2)
        await admin.create_group(GROUP)
    early = await _send(cluster, TOPIC, 0, 6)
    await asyncio.sleep(0.05)
    split_ms = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    late = await _send(cluster, TOPIC, 6, 6)
    async with SimpleConsumer(servers(cluster), GROUP, {TOPIC: "*"}) as consumer, \
            OperationsClient(servers(cluster)) as ops:
        assert len(await _drain(consumer, 12)) == 12
        await asyncio.sleep(1.5)   # the revive commits the pop state's offsets once a second
        progress = await ops.group_progress(GROUP)
        assert progress.total_lag == 0 and {q.topic for q in progress.queues} == {TOPIC}
        for q in progress.queues:
            assert q.committed_offset == q.max_offset and q.in_flight == 0
            assert q.last_consumed_store_ms >= split_ms     # every queue got late messages too

        # A receive that is waiting (long polling) when the reset lands gets the reset's messages.
        waiting = asyncio.create_task(consumer.receive(32, 30, await_duration_s=15))
        await asyncio.sleep(0.5)
        resets = await ops.reset_offset(GROUP, TOPIC, to_time_ms=split_ms)
        expected = {q: min(r.offset for r in late if r.queue_id == q) for q in (0, 1)}
        assert {r.queue_id: r.offset for r in resets} == expected
        assert all(r.previous_offset == max(x.offset for x in early + late if x.queue_id == r.queue_id) + 1
                   for r in resets)
        started = time.monotonic()
        received = await asyncio.wait_for(waiting, 20)
        received += await _drain(consumer, 6 - len(received), ack=False)
        assert time.monotonic() - started < 10, "the waiting consumer did not follow the reset at once"
        assert sorted(m.body for m in received) == sorted(f"pay-{i}".encode() for i in range(6, 12))
        progress = await ops.group_progress(GROUP, TOPIC)
        assert sum(q.in_flight for q in progress.queues) == 6 and progress.total_lag == 6

        # To the end, then kill the leader: the new leader holds the reset.
        await ops.reset_offset(GROUP, TOPIC, to="latest")
    leader = await leader_of(cluster)
    cluster.kill(leader)
    try:
        survivors = ",".join(a for n, a in cluster.addresses.items() if n != leader)
        async with OperationsClient(survivors) as ops:
            progress = await ops.group_progress(GROUP, TOPIC)
        assert progress.total_lag == 0 and all(q.in_flight == 0 for q in progress.queues)
        async with SimpleConsumer(survivors, GROUP, {TOPIC: "*"}) as consumer:
            assert await consumer.receive(32, 30, await_duration_s=1) == []
            fresh = await _send(cluster, TOPIC, 100, 1)
            got = await _drain(consumer, 1)
            assert [m.message_id for m in got] == [fresh[0].message_id]
    finally:
        cluster.start(leader)


async def test_resets_to_earliest_and_to_one_queue_offset(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic("Refunds", 1)
        await admin.create_group("Refunders")
    sent = await _send(cluster, "Refunds", 0, 5)
    async with SimpleConsumer(servers(cluster), "Refunders", {"Refunds": "*"}) as consumer, \
            OperationsClient(servers(cluster)) as ops:
        assert len(await _drain(consumer, 5)) == 5
        [reset] = await ops.reset_offset("Refunders", "Refunds", queue_id=0, offset=3)
        assert (reset.previous_offset, reset.offset) == (5, 3)
        assert [m.message_id for m in await _drain(consumer, 2)] == [r.message_id for r in sent[3:]]
        await ops.reset_offset("Refunders", "Refunds", to="earliest")
        assert sorted(m.message_id for m in await _drain(consumer, 5)) == sorted(r.message_id for r in sent)


async def test_bad_resets_get_a_code_and_a_message(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic("Audits", 1)
        await admin.create_group("Auditors")
    async with OperationsClient(servers(cluster)) as ops:
        with pytest.raises(NotFoundError) as raised:
            await ops.reset_offset("NoSuchGroup", "Audits", to="latest")
        assert raised.value.code == pb.CONSUMER_GROUP_NOT_FOUND
        with pytest.raises(NotFoundError) as raised:
            await ops.reset_offset("Auditors", "NoSuchTopic", to="latest")
        assert raised.value.code == pb.TOPIC_NOT_FOUND
        with pytest.raises(ClientError) as raised:
            await ops.reset_offset("Auditors", "Audits", queue_id=0, offset=999)
        assert raised.value.code == pb.ILLEGAL_OFFSET and "outside" in raised.value.message
        with pytest.raises(BadRequestError) as raised:
            await ops.reset_offset("Auditors", "Audits", queue_id=5, offset=0)
        assert "no queue 5" in raised.value.message


async def test_dead_letters_are_listed_counted_and_sent_back_to_the_group(cluster):
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic("Invoices", 1)
        await admin.create_group("Billing", max_retries=0)
    [sent] = await _send(cluster, "Invoices", 0, 1)
    async with SimpleConsumer(servers(cluster), "Billing", {"Invoices": "*"}) as consumer, \
            OperationsClient(servers(cluster)) as ops:
        [message] = await _drain(consumer, 1, ack=False)
        await consumer.change_invisible_duration(message, 0)     # fail it now: no retry left, so a dead letter
        letters: list = []
        for _ in range(100):
            letters, _ = await ops.dead_letters("Billing")
            if letters:
                break
            await asyncio.sleep(0.1)
        assert [(m.message_id, m.properties["DLQ_ORIGIN_TOPIC"]) for m in letters] == [(sent.message_id, "Invoices")]
        progress = await ops.group_progress("Billing")
        assert progress.dead_letters == 1 and progress.dead_letters_by_topic == {"Invoices": 1}
        resent = await ops.resend_dead_letter("Billing", letters[0].offset_message_id)
        assert (resent.topic, resent.message_id) == ("Invoices", sent.message_id)
        again = await _drain(consumer, 1)
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(sent.message_id, 1)]


def test_the_cli_shows_progress_and_resets(cluster):
    async def prepare() -> None:
        async with AdminClient(servers(cluster)) as admin:
            await admin.create_topic("Ledger", 1)
            await admin.create_group("Ledgers")
        await _send(cluster, "Ledger", 0, 3)
    asyncio.run(prepare())
    reset = _cli("group", "reset", "--servers", servers(cluster), "--group", "Ledgers", "--topic", "Ledger",
                 "--to", "latest", "--json")
    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout)["queues"] == [{"queue_id": 0, "previous_offset": -1, "offset": 3}]
    progress = _cli("group", "progress", "--servers", servers(cluster), "--group", "Ledgers", "--json")
    assert progress.returncode == 0, progress.stderr
    [queue] = json.loads(progress.stdout)["queues"]
    assert (queue["committed_offset"], queue["max_offset"], queue["lag"]) == (3, 3, 0)
    by_time = _cli("group", "reset", "--servers", servers(cluster), "--group", "Ledgers", "--topic", "Ledger",
                   "--to-time=-1h")
    assert by_time.returncode == 0 and "Ledger/0: 3 -> 0" in by_time.stdout
    usage = _cli("group", "reset", "--servers", servers(cluster), "--group", "Ledgers", "--topic", "Ledger",
                 "--queue", "0")
    assert usage.returncode == 2 and "--queue and --offset go together" in usage.stderr
