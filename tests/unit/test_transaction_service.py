"""Transactions on a three-node cluster over the in-memory network, with a
wall clock the test moves: commit and rollback decide once, repeats are
answered as the first was (also by a new leader), and undecided half messages
are checked back with a connected producer, counted on every replica, and
rolled back after the maximum."""
from __future__ import annotations

import asyncio

import pytest

from broker.clients import ClientSession
from broker.errors import BrokerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store import message_const as mc
from tests.unit.broker_harness import BrokerCluster, protocol_message

pytestmark = pytest.mark.timeout(90)
SETTINGS = {"transaction_timeout_s": 5.0, "transaction_check_interval_s": 0.1, "transaction_check_max": 3,
            "transaction_max_lifetime_s": 600.0}


@pytest.fixture
async def cluster(tmp_path):
    c = BrokerCluster(str(tmp_path), broker=SETTINGS)
    await c.start()
    await c.create_topic("Orders", queues=2)
    yield c
    await c.stop()


async def send_half(cluster: BrokerCluster, body: bytes = b"order") -> tuple[str, str]:
    broker = await cluster.leader_broker()
    answer = await broker.sender.send([protocol_message("Orders", body, message_type=pb.TRANSACTION)])
    assert answer.status.code == pb.OK, answer.status.message
    entry = answer.entries[0]
    return entry.message_id, entry.transaction_id


def end_request(message_id: str, transaction_id: str, resolution: int,
                source: int = pb.SOURCE_CLIENT) -> spb.EndTransactionRequest:
    return spb.EndTransactionRequest(topic=pb.Resource(name="Orders"), message_id=message_id,
                                     transaction_id=transaction_id, resolution=resolution, source=source)


def visible(cluster: BrokerCluster, node: str) -> list[bytes]:
    store = cluster.stores[node]
    return [m.body for q in range(2) for m in store.get_messages("Orders", q, 0, 1000).messages]


def connect_producer(cluster: BrokerCluster, node: str) -> ClientSession:
    """A producer of Orders as its Telemetry settings announce it."""
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Orders")]))
    session = ClientSession("producer@1", settings=settings)
    cluster.brokers[node].clients.sessions[session.client_id] = session
    return session


async def test_a_half_message_is_invisible_until_committed_and_a_repeated_commit_changes_nothing(
        cluster: BrokerCluster):
    message_id, transaction = await send_half(cluster)
    await cluster.wait_applied()
    assert all(visible(cluster, n) == [] for n in cluster.stores)
    broker = await cluster.leader_broker()
    await broker.transactions.end(end_request(message_id, transaction, pb.COMMIT))
    await broker.transactions.end(end_request(message_id, transaction, pb.COMMIT))  # a retry
    await cluster.wait_applied()
    for node in cluster.stores:
        assert visible(cluster, node) == [b"order"], node
        assert not cluster.brokers[node].transactions.state.halves
    copy = cluster.stores[await cluster.wait_leader()].get_messages("Orders", 0, 0, 10).messages
    copy += cluster.stores[await cluster.wait_leader()].get_messages("Orders", 1, 0, 10).messages
    assert mc.transaction_type(copy[0].sys_flag) == mc.TRANSACTION_COMMIT_TYPE
    assert mc.REAL_TOPIC not in copy[0].properties


async def test_a_rollback_discards_and_the_other_resolution_afterwards_is_refused(cluster: BrokerCluster):
    message_id, transaction = await send_half(cluster)
    broker = await cluster.leader_broker()
    await broker.transactions.end(end_request(message_id, transaction, pb.ROLLBACK))
    with pytest.raises(BrokerError) as late_commit:
        await broker.transactions.end(end_request(message_id, transaction, pb.COMMIT))
    assert late_commit.value.code == pb.INVALID_TRANSACTION_ID
    await cluster.wait_applied()
    assert all(visible(cluster, n) == [] for n in cluster.stores)


async def test_a_new_leader_answers_a_repeated_commit_without_committing_again(cluster: BrokerCluster):
    message_id, transaction = await send_half(cluster)
    broker = await cluster.leader_broker()
    await broker.transactions.end(end_request(message_id, transaction, pb.COMMIT))
    await cluster.wait_applied()
    old = await cluster.wait_leader()
    term = cluster.servers[old].member_state.term
    await cluster.stop(old)
    new = await cluster.wait_leader(min_term=term + 1)
    await cluster.brokers[new].transactions.end(end_request(message_id, transaction, pb.COMMIT))
    await cluster.wait_applied()
    assert all(visible(cluster, n) == [b"order"] for n in cluster.stores)


async def test_an_undecided_half_is_checked_back_counted_everywhere_then_rolled_back_after_the_max(
        cluster: BrokerCluster):
    leader = await cluster.wait_leader()
    producer = connect_producer(cluster, leader)
    message_id, transaction = await send_half(cluster, b"undecided")
    await cluster.wait_applied()
    cluster.clock.advance(5_000)  # its recovery time (the default here) has passed
    checks: list[spb.TelemetryCommand] = []
    for expected in range(1, 4):
        checks.append(await producer.outbox.get())
        await cluster.eventually(lambda: all(b.transactions.state.get(next(iter(b.transactions.state.halves)))
                                             .check_times == expected for b in cluster.brokers.values()),
                                 what=f"check {expected} counted on every replica")
        cluster.clock.advance(100)
    command = checks[0].recover_orphaned_transaction_command
    assert command.transaction_id == transaction and command.message.topic.name == "Orders"
    assert command.message.system_properties.message_id == message_id and command.message.body == b"undecided"
    assert command.message.system_properties.message_type == pb.TRANSACTION
    await cluster.eventually(lambda: all(not b.transactions.state.halves for b in cluster.brokers.values()),
                             what="rolled back after the third check")
    outcome = cluster.brokers[leader].transactions.state.outcome(next(iter(
        cluster.brokers[leader].transactions.state.outcomes)))
    assert (outcome.resolution, outcome.reason) == ("ROLLBACK", "unanswered")
    assert producer.outbox.empty()


async def test_a_producers_answer_to_a_check_commits(cluster: BrokerCluster):
    leader = await cluster.wait_leader()
    producer = connect_producer(cluster, leader)
    await send_half(cluster, b"checked")
    cluster.clock.advance(5_000)
    command = (await producer.outbox.get()).recover_orphaned_transaction_command
    await cluster.brokers[leader].transactions.end(end_request(
        command.message.system_properties.message_id, command.transaction_id, pb.COMMIT, pb.SOURCE_SERVER_CHECK))
    await cluster.wait_applied()
    assert all(visible(cluster, n) == [b"checked"] for n in cluster.stores)


@pytest.mark.parametrize("change, code", [
    (dict(transaction_id=""), pb.INVALID_TRANSACTION_ID),
    (dict(transaction_id="not-an-id"), pb.INVALID_TRANSACTION_ID),
    (dict(transaction_id="7F0000010000000000000000DEADBEEF"), pb.INVALID_TRANSACTION_ID),
    (dict(message_id="01" + "0" * 32), pb.INVALID_TRANSACTION_ID),
    (dict(topic=pb.Resource(name="Other")), pb.INVALID_TRANSACTION_ID),
    (dict(topic=pb.Resource(name="bad topic")), pb.ILLEGAL_TOPIC),
    (dict(resolution=pb.TRANSACTION_RESOLUTION_UNSPECIFIED), pb.BAD_REQUEST),
])
async def test_a_bad_end_transaction_gets_the_protocols_code_and_decides_nothing(cluster: BrokerCluster, change,
                                                                                code):
    message_id, transaction = await send_half(cluster)
    request = end_request(message_id, transaction, pb.COMMIT)
    for field, value in change.items():
        if isinstance(value, pb.Resource):
            getattr(request, field).CopyFrom(value)
        else:
            setattr(request, field, value)
    broker = await cluster.leader_broker()
    with pytest.raises(BrokerError) as refused:
        await broker.transactions.end(request)
    assert refused.value.code == code
    assert len(broker.transactions.state.halves) == 1


async def test_without_a_connected_producer_checks_are_not_counted_until_the_lifetime_rolls_it_back(
        cluster: BrokerCluster):
    message_id, transaction = await send_half(cluster, b"nobody asked")
    await cluster.wait_applied()
    cluster.clock.advance(5_000)
    await asyncio.sleep(0.5)  # several passes of the checker
    leader = await cluster.leader_broker()
    [half] = [leader.transactions.state.get(offset) for offset in leader.transactions.state.halves]
    assert half.check_times == 0 and leader.transactions.checks_sent == 0
    producer = connect_producer(cluster, await cluster.wait_leader())  # it comes (back): it is asked
    assert (await producer.outbox.get()).recover_orphaned_transaction_command.transaction_id == transaction
    cluster.clock.advance(600_000)
    await cluster.eventually(lambda: all(not b.transactions.state.halves for b in cluster.brokers.values()),
                             what="rolled back at the end of its lifetime")
    with pytest.raises(BrokerError) as late:
        await leader.transactions.end(end_request(message_id, transaction, pb.COMMIT))
    assert late.value.code == pb.INVALID_TRANSACTION_ID


async def test_a_retried_transactional_send_is_one_half_message_with_the_same_transaction_id(cluster: BrokerCluster):
    broker = await cluster.leader_broker()
    first = protocol_message("Orders", b"retried", message_type=pb.TRANSACTION)
    answer = await broker.sender.send([first])
    await cluster.wait_applied()
    again = await broker.sender.send([first])  # the producer's retry after a lost answer
    assert again.entries[0].transaction_id == answer.entries[0].transaction_id != ""
    assert len(broker.transactions.state.halves) == 1
