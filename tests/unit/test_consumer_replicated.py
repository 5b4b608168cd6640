"""The consumer services on three in-process nodes (real DLedgerServers and
stores on the in-memory network): pop state changes share log entries (group
commit), every replica derives the same pop state, a new leader honours the
old leader's leases and acks, and an unknown group is refused when groups are
not auto-created."""
from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from datetime import timedelta

import pytest

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.consumer.receipt import ReceiptHandle
from broker.consumer.receive import ReceiveParams, wall_clock_ms
from broker.errors import BrokerError
from broker.filter_expression import MATCH_ALL
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from store.config import MessageStoreConfig
from store.message_store import MessageStore
from store.socket_address import SocketAddress
from store.subscription_group import SubscriptionGroupConfig
from tests.unit.raft_harness import Cluster
from tests.unit.store_harness import StoreCluster, message

pytestmark = pytest.mark.timeout(60)
TOPIC, GROUP = "Orders", "Billing"
CALM = dict(heartbeat_interval_s=0.1, election_timeout_min_s=0.8, election_timeout_max_s=1.6, rpc_timeout_s=1.0,
            push_timeout_s=1.0, follower_gap_timeout_s=1.0, max_wait_ack_s=5.0)


class BrokerCluster(StoreCluster):
    """StoreCluster with a Broker on every node, built before its store
    starts (as cluster/node.py does) so that the pop state is replayed."""

    def __init__(self, base_dir: str, auto_create_group: bool = True) -> None:
        # Calmer than the Raft tests' timings: these tests are about the
        # consumer, and must not see elections on a busy machine.
        super().__init__(base_dir, **CALM)
        self.auto_create_group = auto_create_group
        self.brokers: dict[str, Broker] = {}

    async def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.configs):
            await Cluster.start(self, node_id)
            server = self.servers[node_id]
            store = MessageStore(MessageStoreConfig(store_dir=os.path.join(self.configs[node_id].data_dir, "store"),
                                                    **self.store_settings),  # type: ignore[arg-type]
                                 server, SocketAddress("127.0.0.1", 30000 + int(node_id[1:])))
            broker = Broker(BrokerConfig("g", ("127.0.0.1:1",), auto_create_group=self.auto_create_group),
                            store, server)
            await store.start()
            await broker.start()
            self.stores[node_id], self.brokers[node_id] = store, broker

    async def stop(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.brokers):
            broker = self.brokers.pop(node_id, None)
            if broker is not None:
                await broker.stop()
        await super().stop(node)

    async def leader_broker(self) -> Broker:
        return self.brokers[await self.wait_leader()]


def params(batch: int = 32, invisible_s: float = 30.0, polling_s: float = 0.0, group: str = GROUP) -> ReceiveParams:
    # Built directly: the protocol's 10 s minimum lease would make these tests slow.
    return ReceiveParams(group, TOPIC, 0, batch, timedelta(seconds=invisible_s), timedelta(seconds=polling_s),
                         MATCH_ALL, None)


def ack_request(*messages: pb.Message) -> spb.AckMessageRequest:
    return spb.AckMessageRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC), entries=[
        spb.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
        for m in messages])


@pytest.fixture
async def cluster(tmp_path):
    c = BrokerCluster(str(tmp_path))
    await c.start()
    await c.create_topic(TOPIC, queues=2)
    store = await c.leader_store()
    await store.put_messages([message(TOPIC, b"m%d" % i, queue_id=i % 2, uniq_key=f"ID{i}") for i in range(40)])
    await c.wait_applied()
    yield c
    await c.stop()


@pytest.mark.parametrize("attempt_ids", [False, True])
async def test_concurrent_receives_and_acks_share_log_entries(cluster: BrokerCluster, attempt_ids: bool):
    # With attempt ids (as our client sends them) too: a receive's claims must
    # be held before the next one selects, or both pick the same message.
    consumer = (await cluster.leader_broker()).consumer
    before = consumer.committer.entries
    batches = await asyncio.gather(*(consumer.receiver.receive(
        replace(params(batch=1), attempt_id=f"concurrent-{i}" if attempt_ids else None)) for i in range(40)))
    received = [m for batch in batches for m in batch]
    assert sorted(m.body for m in received) == sorted(b"m%d" % i for i in range(40))
    receive_entries = consumer.committer.entries - before
    assert receive_entries < 20, receive_entries
    answers = await asyncio.gather(*(consumer.acks.ack(ack_request(m)) for m in received))
    assert all(a.status.code == pb.OK for a in answers)
    assert consumer.committer.entries - before - receive_entries < 20


async def test_an_entry_of_pop_state_changes_is_bounded_by_its_items_as_well_as_its_ops(cluster: BrokerCluster):
    # An op's size grows with its call's batch (an ack of 1,000 entries on one
    # queue is 22 KB of JSON): a thousand such ops must not make one entry
    # past the log's limit. Here the bound is made small enough to split
    # four concurrent acks of ten messages, which otherwise share an entry.
    consumer = (await cluster.leader_broker()).consumer
    received = [m for _ in range(2) for m in await consumer.receiver.receive(params(batch=32))]
    assert len(received) == 40
    consumer.committer.max_weight_per_entry = 12          # one call's two ack ops of five
    before = consumer.committer.entries
    answers = await asyncio.gather(*(consumer.acks.ack(ack_request(*received[i:i + 10])) for i in range(0, 40, 10)))
    assert all(a.status.code == pb.OK for a in answers)
    assert consumer.committer.entries - before >= 3


async def test_every_replica_derives_the_same_pop_state(cluster: BrokerCluster):
    consumer = (await cluster.leader_broker()).consumer
    got = await consumer.receiver.receive(params(batch=16))
    await consumer.acks.ack(ack_request(*got[::3]))
    await cluster.wait_applied()
    snapshots = {node: broker.consumer.state.encode() for node, broker in cluster.brokers.items()}
    assert len({repr(s) for s in snapshots.values()}) == 1
    assert sum(q["inFlight"]["count"] for q in next(iter(snapshots.values()))["popQueues"]) == 16 - len(got[::3])


async def test_a_new_leader_honours_the_old_leaders_leases_and_acks(cluster: BrokerCluster):
    old = await cluster.wait_leader()
    consumer = cluster.brokers[old].consumer
    got = await consumer.receiver.receive(params(batch=10, invisible_s=4.0))  # outlives the election
    acked, held = got[:5], got[5:]
    assert (await consumer.acks.ack(ack_request(*acked))).status.code == pb.OK
    await cluster.wait_applied()
    await cluster.stop(old)
    new = await cluster.wait_leader(timeout=10, among=[n for n in cluster.brokers if n != old])
    successor = cluster.brokers[new].consumer
    # A handle the old leader gave out still works with the new one.
    assert (await successor.acks.ack(ack_request(held[0]))).status.code == pb.OK
    # The rest come back once their lease runs out; nothing acked comes back.
    again: list[pb.Message] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while sum(m.system_properties.delivery_attempt > 1 for m in again) < 4 and loop.time() < deadline:
        again += await successor.receiver.receive(params(batch=40, invisible_s=30.0, polling_s=2.0))
    redelivered = sorted(m.system_properties.message_id for m in again if m.system_properties.delivery_attempt > 1)
    assert redelivered == sorted(m.system_properties.message_id for m in held[1:])
    fresh = {m.system_properties.message_id for m in again if m.system_properties.delivery_attempt == 1}
    assert not fresh & {m.system_properties.message_id for m in got}


async def test_the_pop_state_is_recovered_from_its_snapshot_and_the_log_after_a_restart(cluster: BrokerCluster):
    leader = await cluster.wait_leader()
    consumer = cluster.brokers[leader].consumer
    got = await consumer.receiver.receive(params(batch=8))
    await consumer.acks.ack(ack_request(*got[:4]))
    await cluster.wait_applied()
    follower = next(n for n in cluster.brokers if n != leader)
    expected = cluster.brokers[follower].consumer.state.encode()
    await cluster.stop(follower)
    await cluster.start(follower)
    await cluster.wait_applied()
    assert cluster.brokers[follower].consumer.state.encode() == expected


async def test_an_unknown_group_is_refused_when_groups_are_not_auto_created(tmp_path):
    cluster = BrokerCluster(str(tmp_path), auto_create_group=False)
    await cluster.start()
    try:
        await cluster.create_topic(TOPIC, queues=2)
        broker = await cluster.leader_broker()
        with pytest.raises(BrokerError) as refused:
            await broker.consumer.receiver.receive(params(group="NoSuchGroup"))
        assert refused.value.code == pb.CONSUMER_GROUP_NOT_FOUND
        pull = spb.PullMessageRequest(group=pb.Resource(name="NoSuchGroup"), offset=0, batch_size=1,
                                      message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=0))
        with pytest.raises(BrokerError) as refused:
            await broker.consumer.puller.pull(pull, None)
        assert refused.value.code == pb.CONSUMER_GROUP_NOT_FOUND
    finally:
        await cluster.stop()



async def test_a_backlog_out_of_attempts_goes_to_the_dead_letter_queue_a_bounded_batch_per_revive(cluster):
    # Each dead letter is read and copied on the event loop: a backlog that
    # ran out of attempts together goes over several revives, not in one stall.
    store = await cluster.leader_store()
    await store.update_group(SubscriptionGroupConfig(GROUP, retry_max_times=0))   # one delivery, then the DLQ
    consumer = (await cluster.leader_broker()).consumer
    consumer._revive_task.cancel()           # revives are called here, one at a time
    consumer.reviver.config = replace(consumer.reviver.config, dead_letters_per_revive=5)
    got = await consumer.receiver.receive(params(batch=12, invisible_s=0.05))
    assert len(got) == 12
    await asyncio.sleep(0.1)
    moved = [await consumer.reviver.revive_once() for _ in range(4)]
    assert moved == [5, 5, 2, 0] and store.max_offset(f"%DLQ%{GROUP}", 0) == 12
    assert all(q.in_flight == {} for _, q in consumer.state)


def change_request(message: pb.Message, seconds: float) -> spb.ChangeInvisibleDurationRequest:
    request = spb.ChangeInvisibleDurationRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
                                                 receipt_handle=message.system_properties.receipt_handle,
                                                 message_id=message.system_properties.message_id)
    request.invisible_duration.FromTimedelta(timedelta(seconds=seconds))
    return request


async def test_an_ack_that_loses_the_race_to_a_change_of_invisible_duration_is_refused(cluster: BrokerCluster):
    # Both calls pass their checks against the same lease; the change's entry
    # is appended (and applied) first, so the ack's compare-and-set names a
    # lease that no longer exists. It used to answer OK all the same, and the
    # message came back after the new invisible time.
    consumer = (await cluster.leader_broker()).consumer
    message = (await consumer.receiver.receive(params(batch=1)))[0]
    offset = ReceiptHandle.decode(message.system_properties.receipt_handle, GROUP, TOPIC).offset
    changed, acked = await asyncio.gather(consumer.acks.change_invisible_duration(change_request(message, 2.0)),
                                          consumer.acks.ack(ack_request(message)))
    assert changed.status.code == pb.OK
    assert consumer.state.lease_of(GROUP, TOPIC, 0, offset) is not None
    assert acked.status.code == pb.INVALID_RECEIPT_HANDLE, acked.status
    assert "superseded" in acked.entries[0].status.message, acked.entries[0].status


async def test_an_ack_that_wins_the_race_answers_ok_and_so_does_a_repeat_of_it_in_flight(cluster: BrokerCluster):
    consumer = (await cluster.leader_broker()).consumer
    message = (await consumer.receiver.receive(params(batch=1)))[0]
    offset = ReceiptHandle.decode(message.system_properties.receipt_handle, GROUP, TOPIC).offset
    # Two acks of one handle in flight together (a client retrying): the
    # second's compare-and-set is a no-op, but the message was acked by that
    # handle, so both answer OK.
    first, second, changed = await asyncio.gather(consumer.acks.ack(ack_request(message)),
                                                  consumer.acks.ack(ack_request(message)),
                                                  consumer.acks.change_invisible_duration(change_request(message, 2)),
                                                  return_exceptions=True)
    assert first.status.code == second.status.code == pb.OK, (first.status, second.status)
    assert isinstance(changed, BrokerError) and changed.code == pb.INVALID_RECEIPT_HANDLE
    assert consumer.state.lease_of(GROUP, TOPIC, 0, offset) is None


@pytest.mark.parametrize("ack_first", [True, False])
async def test_an_ack_racing_the_move_to_the_dead_letter_queue_either_acks_or_moves_never_both(cluster, ack_first):
    # The last attempt's lease is about to run out: the ack passes its check,
    # and the revive (whose clock is past the deadline) moves the message at
    # the same moment. The copy used to be written before the lease was
    # ended, so an acknowledged message also landed in %DLQ%.
    store = await cluster.leader_store()
    await store.update_group(SubscriptionGroupConfig(GROUP, retry_max_times=0))
    consumer = (await cluster.leader_broker()).consumer
    consumer._revive_task.cancel()
    message = (await consumer.receiver.receive(params(batch=1)))[0]
    offset = ReceiptHandle.decode(message.system_properties.receipt_handle, GROUP, TOPIC).offset
    consumer.reviver.clock = lambda: wall_clock_ms() + 60_000
    if ack_first:
        acked, moved = await asyncio.gather(consumer.acks.ack(ack_request(message)), consumer.reviver.revive_once())
    else:
        moved, acked = await asyncio.gather(consumer.reviver.revive_once(), consumer.acks.ack(ack_request(message)))
    dead_lettered = store.max_offset(f"%DLQ%{GROUP}", 0)
    assert consumer.state.lease_of(GROUP, TOPIC, 0, offset) is None
    assert (acked.status.code == pb.OK) != (dead_lettered == 1), (acked.status, dead_lettered)
    assert dead_lettered == moved
    if acked.status.code != pb.OK:
        assert "dead-letter" in acked.entries[0].status.message


async def warm_group(cluster: BrokerCluster, node: str) -> None:
    """The group known on every node, so that a receive's first await is
    not its creation (which would give the node time to apply)."""
    await cluster.brokers[node].consumer.receiver.receive(params(batch=1))
    await cluster.wait_applied()


def in_flight(state) -> int:  # noqa: ANN001
    """Leases held now, over every queue."""
    return sum(q["inFlight"]["count"] for q in state.encode()["popQueues"])


def ids(messages: list[pb.Message]) -> list[str]:
    return sorted(m.system_properties.message_id for m in messages)


async def test_a_receive_retried_on_a_new_leader_that_is_still_applying_gets_the_same_batch(cluster: BrokerCluster):
    # The old leader leases a batch under an attempt id and dies before the
    # client hears; the retry (same attempt id) reaches the new leader before
    # it has applied that lease. It must get the same batch back once it has
    # applied the log up to its term, not other messages (or none) while the
    # first batch's lease runs out unseen: that burns a delivery attempt no
    # consumer saw (a 10-minute broker chaos run's dlq_early). Before the fix
    # the attempt id was looked up before the new leader had applied.
    old = await cluster.wait_leader()
    await warm_group(cluster, old)
    followers = [n for n in cluster.brokers if n != old]
    real = {n: cluster.stores[n].reput.apply_available for n in followers}
    for n in followers:
        cluster.stores[n].reput.apply_available = lambda committed: None  # type: ignore[method-assign]
    first = await cluster.brokers[old].consumer.receiver.receive(replace(params(batch=4), attempt_id="retry-1"))
    assert len(first) == 4
    await cluster.stop(old)
    new = await cluster.wait_leader(timeout=10, among=followers)

    async def resume() -> None:
        await asyncio.sleep(1.0)
        for n in followers:
            cluster.stores[n].reput.apply_available = real[n]  # type: ignore[method-assign]

    resuming = asyncio.ensure_future(resume())
    assert cluster.stores[new].applied_index < cluster.servers[new].member_state.committed_index
    assert cluster.brokers[new].consumer.state.recent_receive(GROUP, "retry-1") is None   # not applied yet
    again = await cluster.brokers[new].consumer.receiver.receive(replace(params(batch=4), attempt_id="retry-1"))
    await resuming
    assert ids(again) == ids(first)


async def test_a_receive_whose_lease_the_next_leader_commits_is_answered_there_with_that_lease(
        cluster: BrokerCluster):
    # The chaos run's case: the leader hears neither follower (one-way cut),
    # so the entry leasing a batch reaches both followers but never commits
    # under it. The receive fails there; the next leader commits that entry
    # in its own term, and the retry (same attempt id) gets that batch.
    old = await cluster.wait_leader()
    await warm_group(cluster, old)
    followers = [n for n in cluster.brokers if n != old]
    for n in followers:
        cluster.network.cut_one_way(n, old)
    with pytest.raises(Exception):
        await cluster.brokers[old].consumer.receiver.receive(replace(params(batch=4), attempt_id="cut-1"))
    new = await cluster.wait_leader(timeout=15, among=followers)
    again = await cluster.brokers[new].consumer.receiver.receive(replace(params(batch=4), attempt_id="cut-1"))
    leased = cluster.brokers[new].consumer.state.recent_receive(GROUP, "cut-1")
    assert leased is not None and len(leased.offsets) == 4, "the cut leader's lease was not committed"
    assert len(again) == 4
    assert sorted((m.system_properties.queue_id, m.system_properties.queue_offset) for m in again) == \
        sorted(leased.offsets)


async def lease_then_lose_the_leader(cluster: BrokerCluster, attempt_id: str) -> tuple[list[pb.Message], Broker]:
    """A batch leased for 0.5 s under `attempt_id` by a leader that is then
    stopped (its answer, for the test, lost), and the next leader's broker
    once that lease has run out."""
    old = await cluster.wait_leader()
    await warm_group(cluster, old)
    first = await cluster.brokers[old].consumer.receiver.receive(
        replace(params(batch=4, invisible_s=0.5), attempt_id=attempt_id))
    assert [m.system_properties.delivery_attempt for m in first] == [1, 1, 1, 1]
    await cluster.wait_applied()
    await cluster.stop(old)
    new = await cluster.wait_leader(timeout=10, among=list(cluster.brokers))
    await asyncio.sleep(0.6)   # the first lease has run out
    return first, cluster.brokers[new]


async def test_a_retried_receive_whose_lease_ran_out_meanwhile_gets_its_batch_on_a_renewed_lease(
        cluster: BrokerCluster):
    # The leader leases a batch under an attempt id and dies before the
    # client hears; the retry reaches the next leader after the lease ran
    # out. The batch is still that receive's (nothing else took it): the
    # retry gets it at the same attempt, on a lease renewed through the log,
    # with handles that ack. Before, the lapsed leases were left out of the
    # repeat and the messages came back as the next attempt (with the last
    # attempt: into the dead-letter queue one delivery early, a 10-minute
    # chaos run's dlq_early).
    first, broker = await lease_then_lose_the_leader(cluster, "late-1")
    again = await broker.consumer.receiver.receive(replace(params(batch=4, invisible_s=30), attempt_id="late-1"))
    assert ids(again) == ids(first)
    assert [m.system_properties.delivery_attempt for m in again] == [1, 1, 1, 1]
    assert all(m.system_properties.invisible_duration.seconds >= 25 for m in again)
    answer = await broker.consumer.acks.ack(ack_request(*again))
    assert [e.status.code for e in answer.entries] == [pb.OK] * 4


async def test_a_receive_retried_twice_gets_its_batch_again_after_the_first_retrys_renewal_ran_out(
        cluster: BrokerCluster):
    # The first retry renewed the lapsed leases, and its answer was lost
    # too; the next try, after the renewed leases ran out as well, still
    # gets the batch at the same attempt (the renewal is a lease of the
    # batch's lineage), not the messages again as attempt 2.
    first, broker = await lease_then_lose_the_leader(cluster, "twice-1")
    receiver = broker.consumer.receiver
    lost = await receiver.receive(replace(params(batch=4, invisible_s=0.5), attempt_id="twice-1"))
    assert ids(lost) == ids(first)
    await asyncio.sleep(0.6)   # the renewed leases have run out too
    again = await receiver.receive(replace(params(batch=4, invisible_s=30), attempt_id="twice-1"))
    assert ids(again) == ids(first)
    assert [m.system_properties.delivery_attempt for m in again] == [1, 1, 1, 1]
    answer = await broker.consumer.acks.ack(ack_request(*again))
    assert [e.status.code for e in answer.entries] == [pb.OK] * 4


@pytest.mark.parametrize("first_call", ["waiting", "cancelled"])
async def test_a_receive_retried_while_its_first_try_is_in_flight_gets_the_same_batch(cluster: BrokerCluster,
                                                                                      first_call: str):
    # A client whose call timed out retries on the same leader while the
    # entry of its first try is not committed yet: it waits for that entry
    # and gets its batch, rather than a second batch beside the first. The
    # first call may still be waiting, or gone (the server cancels the
    # handler of a call whose client gave up): its entry commits either way.
    leader = await cluster.wait_leader()
    await warm_group(cluster, leader)
    receiver = cluster.brokers[leader].consumer.receiver
    state = cluster.brokers[leader].consumer.state
    leased_before = in_flight(state)
    cluster.network.delay_s = 0.3
    try:
        first = asyncio.ensure_future(receiver.receive(replace(params(batch=4), attempt_id="slow-1")))
        await asyncio.sleep(0.05)
        assert not first.done()
        if first_call == "cancelled":
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first   # gone before the retry arrives
        second = await receiver.receive(replace(params(batch=4), attempt_id="slow-1"))
    finally:
        cluster.network.delay_s = 0.0
    recent = state.recent_receive(GROUP, "slow-1")
    assert recent is not None and len(recent.offsets) == 4
    assert in_flight(state) == leased_before + 4, "a second batch was leased beside the first"
    assert sorted((m.system_properties.queue_id, m.system_properties.queue_offset) for m in second) == \
        sorted(recent.offsets)
    if first_call == "waiting":
        assert ids(second) == ids(await first)
