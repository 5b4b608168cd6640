"""Message query (pydledger.admin.v1.OperationsService) on three real node
processes: by key, by both kinds of message id, by queue offset and by time,
answered by the leader and by a follower from committed data, and again
after the leader is killed; bad input gets a code and a message; a resend
redelivers one consumed message to one group, through the log."""
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

TOPIC = "Orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("query"), extra_args=[*SPARSE_FILES])
    c.start()
    yield c
    c.stop_all()


@pytest.fixture(scope="module")
def sent(cluster):
    """20 messages: key k<i> each, and the shared key "batch" on all of them,
    with one pause in the middle so that a time splits them."""
    async def send() -> tuple[list, int]:
        async with AdminClient(servers(cluster)) as admin:
            await admin.create_topic(TOPIC, 2)
        receipts = []
        async with Producer(servers(cluster)) as producer:
            for i in range(10):
                receipts.append(await producer.send(Message(TOPIC, f"body-{i}".encode(), tag="TagA",
                                                            keys=[f"k{i}", "batch"])))
            await asyncio.sleep(0.05)
            split_ms = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            for i in range(10, 20):
                receipts.append(await producer.send(Message(TOPIC, f"body-{i}".encode(), tag="TagB",
                                                            keys=[f"k{i}", "batch"])))
        # A follower learns of a commit with the leader's next push or
        # heartbeat: wait until every node answers from all of them.
        answers = await _on_every_node(cluster, lambda ops: _all_there(ops, 20))
        assert all(answers.values()), answers
        return receipts, split_ms
    return asyncio.run(send())


async def _all_there(ops: OperationsClient, count: int) -> bool:
    return len(await ops.query_by_key(TOPIC, "batch", max_results=100)) == count


async def _follower(cluster) -> str:
    leader = await leader_of(cluster)
    return next(a for n, a in cluster.addresses.items() if n != leader)


async def _on_every_node(cluster, ask):
    """The answer of each node asked on its own (a follower's from its applied
    log, so give it a moment to apply the last entries)."""
    answers = {}
    for node, address in cluster.addresses.items():
        async with OperationsClient(address) as ops:
            for _ in range(50):
                answer = await ask(ops)
                if answer:
                    break
                await asyncio.sleep(0.05)
            answers[node] = answer
    return answers


async def test_a_key_finds_its_message_whole_on_every_node(cluster, sent):
    receipts, _ = sent
    answers = await _on_every_node(cluster, lambda ops: ops.query_by_key(TOPIC, "k3"))
    for node, found in answers.items():
        assert len(found) == 1, node
        m = found[0]
        assert (m.body, m.tag, m.message_id) == (b"body-3", "TagA", receipts[3].message_id)
        assert set(m.keys) == {"k3", "batch"} and m.properties["KEYS"] == "k3 batch"
        assert (m.queue_id, m.queue_offset) == (receipts[3].queue_id, receipts[3].offset)
        assert m.store_timestamp_ms >= m.born_timestamp_ms > 0 and len(m.offset_message_id) == 32


async def test_a_shared_key_answers_newest_first_within_max_and_time_range(cluster, sent):
    receipts, split_ms = sent
    async with OperationsClient(await _follower(cluster)) as ops:
        everything = await ops.query_by_key(TOPIC, "batch", max_results=100)
        assert [m.body for m in everything] == [f"body-{i}".encode() for i in reversed(range(20))]
        assert len(await ops.query_by_key(TOPIC, "batch", max_results=5)) == 5
        late = await ops.query_by_key(TOPIC, "batch", begin_ms=split_ms, max_results=100)
        early = await ops.query_by_key(TOPIC, "batch", end_ms=split_ms, max_results=100)
    assert {m.tag for m in late} == {"TagB"} and len(late) == 10
    assert {m.tag for m in early} == {"TagA"} and len(early) == 10


async def test_both_kinds_of_message_id_find_the_message(cluster, sent):
    receipts, _ = sent
    async with OperationsClient(await _follower(cluster)) as ops:
        by_client_id = await ops.query_by_id(receipts[7].message_id)          # every topic searched
        assert [m.body for m in by_client_id] == [b"body-7"]
        by_offset_id = await ops.query_by_id(by_client_id[0].offset_message_id)
        assert [m.message_id for m in by_offset_id] == [receipts[7].message_id]
        narrowed = await ops.query_by_id(receipts[7].message_id, topic=TOPIC)
        assert narrowed[0].physical_offset == by_client_id[0].physical_offset


async def test_queue_offset_and_time_find_the_messages_of_a_queue(cluster, sent):
    receipts, split_ms = sent
    queue = receipts[0].queue_id
    mine = [r for r in receipts if r.queue_id == queue]
    async with OperationsClient(await _follower(cluster)) as ops:
        found, next_offset = await ops.query_by_offset(TOPIC, queue, mine[1].offset, count=2)
        assert [m.message_id for m in found] == [r.message_id for r in mine[1:3]]
        assert next_offset == mine[2].offset + 1
        first_late = next(r for r in mine if receipts.index(r) >= 10)
        assert await ops.search_offset(TOPIC, queue, split_ms) == first_late.offset
        at_time, _ = await ops.query_by_time(TOPIC, queue, split_ms)
        assert at_time[0].message_id == first_late.message_id
        # Past every message: the queue's end, no message.
        end = await ops.search_offset(TOPIC, queue, int(time.time() * 1000) + 60_000)
        assert end == mine[-1].offset + 1


async def test_bad_input_gets_a_code_and_a_message(cluster, sent):
    async with OperationsClient(servers(cluster)) as ops:
        with pytest.raises(NotFoundError) as raised:
            await ops.query_by_key("NoSuchTopic", "k1")
        assert raised.value.code == pb.TOPIC_NOT_FOUND and "NoSuchTopic" in raised.value.message
        with pytest.raises(BadRequestError) as raised:
            await ops.query_by_id("not-an-id")
        assert raised.value.code == pb.BAD_REQUEST and "neither an offset message id" in raised.value.message
        with pytest.raises(BadRequestError) as raised:
            await ops.query_by_key(TOPIC, "k1", begin_ms=2_000, end_ms=1_000)
        assert "before the begin" in raised.value.message
        with pytest.raises(BadRequestError) as raised:
            await ops.query_by_key(TOPIC, "k1", max_results=1_000_000)
        assert "max must be 1 to 1000" in raised.value.message
        with pytest.raises(ClientError) as raised:
            await ops.query_by_offset(TOPIC, 0, 10_000)
        assert raised.value.code == pb.ILLEGAL_OFFSET and "outside" in raised.value.message
        with pytest.raises(BadRequestError):
            await ops.query_by_offset(TOPIC, 99, 0)
        with pytest.raises(NotFoundError) as raised:
            await ops.query_by_id("7F0000010000000000000000DEADBEEF")     # an offset id naming nothing
        assert raised.value.code == pb.MESSAGE_NOT_FOUND


async def test_a_resend_redelivers_one_consumed_message_to_one_group(cluster, sent):
    receipts, _ = sent
    target = receipts[4]
    async with SimpleConsumer(servers(cluster), "Resenders", {TOPIC: "*"}) as consumer:
        got = []
        for _ in range(20):
            received = await consumer.receive(32, 30, await_duration_s=1)
            await consumer.ack(*received)
            got.extend(received)
            if len(got) >= 20:
                break
        assert len(got) == 20
        async with OperationsClient(servers(cluster)) as ops:
            # The first server may be a follower, an entry or so behind the leader's acks.
            assert await _state_becomes(ops, target.message_id, "Resenders", "consumed")
            resent = await ops.resend(target.message_id, "Resenders")
            assert resent.delivery.state == "awaiting_redelivery"
            with pytest.raises(BadRequestError) as raised:          # not consumed now: it waits for delivery
                await ops.resend(target.message_id, "Resenders")
            assert "only a consumed message is resent" in raised.value.message
            again = await consumer.receive(32, 30, await_duration_s=2)
            assert [(m.message_id, m.delivery_attempt) for m in again] == [(target.message_id, 1)]
            assert await _state_becomes(ops, target.message_id, "Resenders", "in_flight")
            leased = await ops.query_by_id(target.message_id, group="Resenders")
            assert leased[0].delivery.attempts == 1
            await consumer.ack(*again)
            # Another group was never given it again.
            with pytest.raises(ClientError):
                await ops.resend(target.message_id, "NoSuchGroup")


async def _state_becomes(ops: OperationsClient, message_id: str, group: str, state: str) -> bool:
    for _ in range(50):
        found = await ops.query_by_id(message_id, group=group)
        if found[0].delivery.state == state:
            return True
        await asyncio.sleep(0.05)
    return False


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)


def test_the_cli_queries_by_key_and_reports_bad_input(cluster, sent):
    receipts, _ = sent
    done = _cli("message", "query", "--servers", servers(cluster), "--topic", TOPIC, "--key", "k5", "--json")
    assert done.returncode == 0, done.stderr
    [message] = json.loads(done.stdout)["messages"]
    assert message["message_id"] == receipts[5].message_id and message["tag"] == "TagA"
    bad = _cli("message", "query", "--servers", servers(cluster), "--topic", TOPIC, "--key", "k5",
               "--begin", "2026-01-02T00:00:00Z", "--end", "2026-01-01T00:00:00Z")
    assert bad.returncode == 1 and "before the begin" in bad.stderr
    huge = _cli("message", "query", "--servers", servers(cluster), "--topic", TOPIC, "--key", "k5", "--max", "99999")
    assert huge.returncode == 1 and "BAD_REQUEST" in huge.stderr
    unknown = _cli("message", "query", "--servers", servers(cluster), "--topic", "Nope", "--key", "k5")
    assert unknown.returncode == 1 and "TOPIC_NOT_FOUND" in unknown.stderr


async def test_queries_answer_the_same_after_the_leader_is_killed(cluster, sent):
    """Last in the module: it kills the leader (and restarts it)."""
    receipts, _ = sent
    leader = await leader_of(cluster)
    cluster.kill(leader)
    try:
        survivors = ",".join(a for n, a in cluster.addresses.items() if n != leader)
        async with OperationsClient(survivors) as ops:
            found = await ops.query_by_key(TOPIC, "k11")
            assert [m.message_id for m in found] == [receipts[11].message_id]
        new_leader = await leader_of(cluster)
        assert new_leader != leader
        async with OperationsClient(cluster.addresses[new_leader]) as ops:
            assert [m.body for m in await ops.query_by_id(receipts[12].message_id)] == [b"body-12"]
    finally:
        cluster.start(leader)
