"""Transactional messages on three real node processes: a half message is
invisible until committed, rollback discards, a producer connected over
Telemetry is asked about an undecided one and its answer decides it, an
unanswered one is rolled back after the maximum number of checks, bad input
gets the protocol's codes, and after the leader is SIGKILLed a committed
transaction is not committed again and an undecided one is still checked.

The nodes run with short check-back times from the TOML's [broker] table."""
from __future__ import annotations

import asyncio

import pytest

from cluster.process_cluster import ProcessCluster
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from tests.integration.broker_helpers import (METADATA, QueueReader, TelemetryProducer, Watcher, leader_of, message,
                                              recovery, retrying, send, stubs_of, wait_caught_up)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
QUEUES = 8
BROKER_TOML = """
[broker]
transaction_timeout_s = 2.0
transaction_check_interval_s = 1.0
transaction_check_max = 3
"""


def start_cluster(base) -> ProcessCluster:
    base.mkdir(parents=True, exist_ok=True)
    config = base / "node.toml"
    config.write_text(BROKER_TOML)
    cluster = ProcessCluster(base, extra_args=["--config", str(config)])
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("transactions"))
    yield c
    c.stop_all()


@pytest.fixture
async def stubs(cluster):
    leader = await leader_of(cluster)
    channels, by_node = stubs_of(cluster.addresses)
    yield leader, by_node
    for channel in channels.values():
        await channel.close()


def half(topic: str, body: bytes, recovery_s: float | None = None) -> pb.Message:
    extra = {} if recovery_s is None else {"orphaned_transaction_recovery_duration": recovery(recovery_s)}
    return message(topic, body, message_type=pb.TRANSACTION, **extra)


async def send_half(stub, m: pb.Message) -> spb.SendResultEntry:
    answer = await send(stub, m)
    assert answer.status.code == pb.OK, answer.status
    assert answer.entries[0].transaction_id
    return answer.entries[0]


async def end(stub, topic: str, entry: spb.SendResultEntry, resolution: int,
              source: int = pb.SOURCE_CLIENT) -> spb.EndTransactionResponse:
    request = spb.EndTransactionRequest(topic=pb.Resource(name=topic), message_id=entry.message_id,
                                        transaction_id=entry.transaction_id, resolution=resolution, source=source)
    return await retrying(lambda: stub.EndTransaction(request, metadata=METADATA, timeout=10))


def watcher(cluster: ProcessCluster, node: str, topic: str) -> Watcher:
    return Watcher(QueueReader(cluster.base / node, node), topic, QUEUES)


async def test_a_half_message_is_invisible_until_commit_and_a_rollback_discards(cluster, stubs):
    leader, by_node = stubs
    follower = next(n for n in by_node if n != leader)
    committed = await send_half(by_node[leader], half("Tx", b"committed", recovery_s=60))
    rolled_back = await send_half(by_node[follower], half("Tx", b"rolled back", recovery_s=60))
    seen = watcher(cluster, leader, "Tx")
    await asyncio.sleep(0.3)
    seen.poll()
    assert not seen.seen, "a half message is visible"
    assert (await end(by_node[follower], "Tx", committed, pb.COMMIT)).status.code == pb.OK
    assert (await end(by_node[leader], "Tx", rolled_back, pb.ROLLBACK)).status.code == pb.OK
    await seen.until({committed.message_id}, timeout=5)
    # Repeats are answered as the first was; the opposite is refused.
    assert (await end(by_node[leader], "Tx", committed, pb.COMMIT)).status.code == pb.OK
    assert (await end(by_node[leader], "Tx", rolled_back, pb.ROLLBACK)).status.code == pb.OK
    assert (await end(by_node[leader], "Tx", rolled_back, pb.COMMIT)).status.code == pb.INVALID_TRANSACTION_ID
    await asyncio.sleep(0.3)
    seen.poll()
    assert seen.copies == {committed.message_id: 1}
    assert seen.seen[committed.message_id][1].body == b"committed"


async def test_a_producer_is_asked_about_an_undecided_half_and_its_answer_commits(cluster, stubs):
    leader, by_node = stubs
    follower = next(n for n in by_node if n != leader)
    producer = TelemetryProducer(by_node[follower], "checked-producer@1", ["Checked"])  # forwarded to the leader
    try:
        await asyncio.wait_for(producer.settled.wait(), 10)
        entry = await send_half(by_node[leader], half("Checked", b"ask me", recovery_s=1))
        check = await producer.check(timeout=10)
        assert check.transaction_id == entry.transaction_id
        assert check.message.system_properties.message_id == entry.message_id
        assert check.message.topic.name == "Checked" and check.message.body == b"ask me"
        answer = await by_node[leader].EndTransaction(spb.EndTransactionRequest(
            topic=check.message.topic, message_id=check.message.system_properties.message_id,
            transaction_id=check.transaction_id, resolution=pb.COMMIT, source=pb.SOURCE_SERVER_CHECK),
            metadata=producer.metadata, timeout=10)
        assert answer.status.code == pb.OK, answer.status
        await watcher(cluster, leader, "Checked").until({entry.message_id}, timeout=5)
    finally:
        await producer.close()


async def test_an_unanswered_half_is_checked_the_maximum_times_then_rolled_back(cluster, stubs):
    leader, by_node = stubs
    producer = TelemetryProducer(by_node[leader], "silent-producer@1", ["Silent"])
    try:
        await asyncio.wait_for(producer.settled.wait(), 10)
        entry = await send_half(by_node[leader], half("Silent", b"never answered", recovery_s=1))
        loop = asyncio.get_running_loop()
        times = []
        for _ in range(3):
            check = await producer.check(timeout=10)
            assert check.transaction_id == entry.transaction_id
            times.append(loop.time())
        assert all(b - a > 0.5 for a, b in zip(times, times[1:])), "checks closer than the check interval"
        with pytest.raises(asyncio.TimeoutError):
            await producer.check(timeout=2.5)  # no fourth check: it was rolled back
        late = await end(by_node[leader], "Silent", entry, pb.COMMIT)
        assert late.status.code == pb.INVALID_TRANSACTION_ID and "ROLLBACK" in late.status.message
        seen = watcher(cluster, leader, "Silent")
        seen.poll()
        assert not seen.seen
    finally:
        await producer.close()


async def test_bad_end_transactions_get_the_protocols_codes(cluster, stubs):
    leader, by_node = stubs
    entry = await send_half(by_node[leader], half("BadEnd", b"x", recovery_s=60))
    cases = [
        (dict(transaction_id="garbage"), pb.INVALID_TRANSACTION_ID),
        (dict(transaction_id=""), pb.INVALID_TRANSACTION_ID),
        (dict(message_id="01" + "AB" * 16), pb.INVALID_TRANSACTION_ID),
        (dict(resolution=pb.TRANSACTION_RESOLUTION_UNSPECIFIED), pb.BAD_REQUEST),
        (dict(topic="bad topic!"), pb.ILLEGAL_TOPIC),
        (dict(topic="RMQ_SYS_TRANS_HALF_TOPIC"), pb.ILLEGAL_TOPIC),
    ]
    for change, code in cases:
        fields = dict(topic="BadEnd", message_id=entry.message_id, transaction_id=entry.transaction_id,
                      resolution=pb.COMMIT, source=pb.SOURCE_CLIENT)
        fields.update(change)
        request = spb.EndTransactionRequest(topic=pb.Resource(name=fields.pop("topic")), **fields)
        answer = await by_node[leader].EndTransaction(request, metadata=METADATA, timeout=10)
        assert answer.status.code == code, (change, answer.status)
        assert answer.status.message
    no_id = await by_node[leader].EndTransaction(spb.EndTransactionRequest(), metadata=[], timeout=10)
    assert no_id.status.code == pb.CLIENT_ID_REQUIRED
    assert (await end(by_node[leader], "BadEnd", entry, pb.ROLLBACK)).status.code == pb.OK


async def test_after_a_sigkilled_leader_committed_stays_once_undecided_is_still_checked(tmp_path):
    cluster = start_cluster(tmp_path)
    channels, by_node = stubs_of(cluster.addresses)
    producer = None
    try:
        leader = await leader_of(cluster)
        committed = await send_half(by_node[leader], half("Fail", b"committed", recovery_s=60))
        rolled_back = await send_half(by_node[leader], half("Fail", b"rolled back", recovery_s=60))
        undecided = await send_half(by_node[leader], half("Fail", b"undecided", recovery_s=3))
        assert (await end(by_node[leader], "Fail", committed, pb.COMMIT)).status.code == pb.OK
        assert (await end(by_node[leader], "Fail", rolled_back, pb.ROLLBACK)).status.code == pb.OK
        await wait_caught_up(cluster)   # the two left must be able to elect a leader
        cluster.kill(leader)
        survivor = next(n for n in cluster.ids if n != leader)
        again = await retrying(lambda: end(by_node[survivor], "Fail", committed, pb.COMMIT))
        assert again.status.code == pb.OK, again.status  # the new leader knows it was committed
        late = await retrying(lambda: end(by_node[survivor], "Fail", rolled_back, pb.COMMIT))
        assert late.status.code == pb.INVALID_TRANSACTION_ID
        new_leader = await leader_of(cluster)
        producer = TelemetryProducer(by_node[new_leader], "failover-producer@1", ["Fail"])
        check = await producer.check(timeout=15)
        assert check.transaction_id == undecided.transaction_id
        answer = await retrying(lambda: end(by_node[new_leader], "Fail", undecided, pb.COMMIT, pb.SOURCE_SERVER_CHECK))
        assert answer.status.code == pb.OK, answer.status
        cluster.start(leader)
        seen = watcher(cluster, new_leader, "Fail")
        await seen.until({committed.message_id, undecided.message_id}, timeout=10)
        await asyncio.sleep(0.3)
        seen.poll()
        assert seen.copies == {committed.message_id: 1, undecided.message_id: 1}
    finally:
        if producer is not None:
            await producer.close()
        for channel in channels.values():
            await channel.close()
        cluster.stop_all()


OFFICIAL_CLIENT = """
import json, sys, threading, time
from rocketmq import (ClientConfiguration, Credentials, Message, Producer, TransactionChecker,
                      TransactionResolution)

checked = threading.Event()

class Checker(TransactionChecker):
    def check(self, message):
        print(json.dumps({"checked": message.message_id, "body": message.body.decode()}), flush=True)
        checked.set()
        return TransactionResolution.COMMIT

def out(**fields):
    print(json.dumps(fields), flush=True)

producer = Producer(ClientConfiguration(sys.argv[1], Credentials()), ("Official",), Checker())
producer.startup()
try:
    def delayed(body, seconds):
        m = Message(); m.topic = "Official"; m.body = body
        # This client puts delivery_timestamp into Timestamp.seconds as is:
        # its own docstring says ms, but only seconds work (against RocketMQ too).
        m.delivery_timestamp = int(time.time()) + seconds
        return producer.send(m)
    timed = delayed(b"timed", 2)
    out(timed=timed.message_id, recall_handle=bool(timed.recall_handle))
    recalled = delayed(b"recalled", 3)
    out(recalled=producer.recall_message("Official", recalled.recall_handle))

    transaction = producer.begin_transaction()
    m = Message(); m.topic = "Official"; m.body = b"committed"
    receipt = producer.send(m, transaction)
    transaction.commit()
    out(committed=receipt.message_id, transaction_id=receipt.transaction_id)

    orphan = producer.begin_transaction()
    m = Message(); m.topic = "Official"; m.body = b"orphaned"
    out(orphaned=producer.send(m, orphan).message_id)
    out(check_arrived=checked.wait(20))
    time.sleep(1.0)  # the checker's EndTransaction goes out asynchronously
finally:
    producer.shutdown()
"""


def test_the_official_clients_delayed_and_transactional_messages_with_its_checker(cluster):
    import json
    import subprocess
    import sys
    from pathlib import Path

    async def topic_ready() -> None:  # the client gives up on a route it cannot fetch at once
        channels, by_node = stubs_of(cluster.addresses)
        route = spb.QueryRouteRequest(topic=pb.Resource(name="Official"), endpoints=pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))
        answer = await retrying(lambda: by_node[cluster.ids[0]].QueryRoute(route, metadata=METADATA, timeout=10))
        assert answer.status.code == pb.OK, answer.status
        for channel in channels.values():
            await channel.close()

    asyncio.run(topic_ready())
    done = subprocess.run([sys.executable, "-c", OFFICIAL_CLIENT, ";".join(cluster.addresses.values())],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    said: dict[str, object] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            said.update(json.loads(line))
    assert said.get("recall_handle") is True, done.stdout
    assert said.get("check_arrived") is True and said.get("checked") == said.get("orphaned"), done.stdout
    assert said.get("recalled"), done.stdout

    async def visible() -> Watcher:
        leader = await leader_of(cluster)
        seen = watcher(cluster, leader, "Official")
        await seen.until({said["timed"], said["committed"], said["orphaned"]}, timeout=10)  # type: ignore[arg-type]
        await asyncio.sleep(1.5)  # the recalled one was due by now
        seen.poll()
        return seen

    seen = asyncio.run(visible())
    assert said["recalled"] not in seen.seen
    assert set(seen.copies.values()) == {1}
    assert {s.body for _, s in seen.seen.values()} == {b"timed", b"committed", b"orphaned"}
