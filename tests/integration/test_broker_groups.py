"""Broker groups behind a name server: two DLedger groups of three node
processes each and one name server, on loopback (one cluster for the whole
module). Each group's leader registers the group; QueryRoute on any node of
either group answers with the topic's queues in both groups, each queue
naming its own group and that group's endpoints; unknown topics are created
in every group through the default topic's route; a leader change, an
expired group and a restarted name server are seen within the times the
design promises."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc
import pytest

from broker.client import ClientError, Message, Producer, PullConsumer, SimpleConsumer
from broker.client.message import SendReceipt
from broker.registration import RETRY_S
from cluster.process_cluster import free_ports
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc
from tests.integration.consume_helpers import METADATA
from tests.integration.groups_cluster import EXPIRY_S, REGISTER_INTERVAL_S, GroupsCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    cluster = GroupsCluster(tmp_path_factory.mktemp("groups"))
    cluster.start()
    try:
        asyncio.run(_prepare(cluster))
        yield cluster
    finally:
        cluster.stop()


async def _prepare(cluster: GroupsCluster) -> None:
    await cluster.wait_registered()
    await cluster.create_topic("Spread", 4)
    await cluster.create_topic("OnlyG1", 2, groups=["g1"])
    await cluster.create_topic("SpreadFifo", 2, message_type=apb.FIFO)


async def query_route(address: str, topic: str) -> spb.QueryRouteResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(spb.QueryRouteRequest(
            topic=pb.Resource(name=topic),
            endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)])),
            metadata=METADATA, timeout=20)


def by_group(queues) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for q in queues:
        found.setdefault(q.broker.name, []).append(q.id)
    return found


async def wait_route(groups: GroupsCluster, address: str, topic: str, wanted: dict[str, list[int]],
                     timeout: float = 15.0) -> spb.QueryRouteResponse:
    deadline = time.monotonic() + timeout
    while True:
        route = await query_route(address, topic)
        if route.status.code == pb.OK and by_group(route.message_queues) == wanted:
            return route
        assert time.monotonic() < deadline, (route.status, by_group(route.message_queues))
        await asyncio.sleep(0.1)


async def test_any_node_of_any_group_routes_a_topic_to_the_queues_of_both_groups(groups):
    wanted = {"g0": [0, 1, 2, 3], "g1": [0, 1, 2, 3]}
    for group in groups.groups:
        for address in groups.addresses(group):
            route = await wait_route(groups, address, "Spread", wanted)
            for queue in route.message_queues:
                assert queue.broker.id == 0
                endpoints = [f"{a.host}:{a.port}" for a in queue.broker.endpoints.addresses]
                assert sorted(endpoints) == sorted(groups.addresses(queue.broker.name))
    # A topic only one group holds is routed to that group only, from either.
    await wait_route(groups, groups.addresses("g0")[1], "OnlyG1", {"g1": [0, 1]})


async def test_query_assignment_lists_the_readable_queues_of_both_groups(groups):
    await wait_route(groups, groups.addresses("g1")[0], "Spread", {"g0": [0, 1, 2, 3], "g1": [0, 1, 2, 3]})
    async with grpc.aio.insecure_channel(groups.addresses("g1")[2]) as channel:
        answer = await service_pb2_grpc.MessagingServiceStub(channel).QueryAssignment(spb.QueryAssignmentRequest(
            topic=pb.Resource(name="Spread"), group=pb.Resource(name="AssignGroup"),
            endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)])),
            metadata=METADATA, timeout=20)
    assert answer.status.code == pb.OK, answer.status
    assert by_group(a.message_queue for a in answer.assignments) == {"g0": [0, 1, 2, 3], "g1": [0, 1, 2, 3]}


async def test_an_unknown_topic_is_created_in_every_group_through_the_default_topic_route(groups):
    route = await query_route(groups.addresses("g1")[1], "AutoMade")
    assert route.status.code == pb.OK, route.status
    assert by_group(route.message_queues) == {"g0": list(range(8)), "g1": list(range(8))}
    # Both groups hold it now: the route from the other group says the same.
    await wait_route(groups, groups.addresses("g0")[2], "AutoMade", {"g0": list(range(8)), "g1": list(range(8))})


async def test_a_route_query_for_an_illegal_topic_is_refused(groups):
    for topic in ("bad topic", "", "TBW102", "rmq_sys_x"):
        route = await query_route(groups.addresses("g0")[0], topic)
        assert route.status.code == pb.ILLEGAL_TOPIC, (topic, route.status)


async def test_a_node_claiming_a_group_it_is_not_in_is_refused_by_the_name_server(groups):
    info = await groups.wait_registered()
    g1 = next(g for g in info.groups if g.broker_name == "g1")
    leader = next(n for n in g1.nodes if n.broker_id == 0)
    claim = npb.RegisterBrokerRequest(cluster_name="DefaultCluster", broker_name="g0", node_id=leader.id,
                                      term=g1.term + 100,
                                      nodes=[npb.BrokerNode(id=leader.id, address=leader.address, broker_id=0,
                                                            role="LEADER")])
    async with grpc.aio.insecure_channel(groups.namesrv.address) as channel:
        answer = await namesrv_pb2_grpc.NameServerStub(channel).RegisterBroker(claim, timeout=5)
    assert answer.status.code == pb.FORBIDDEN and "member of group 'g1'" in answer.status.message
    info = await groups.cluster_info()
    assert {g.broker_name: g.leader_id[:2] for g in info.groups} == {"g0": "g0", "g1": "g1"}


async def test_our_producer_spreads_over_both_groups_and_our_consumer_receives_and_acks_from_each(groups):
    topic = "Spread"
    async with Producer(groups.addresses("g0")[:1]) as producer:
        receipts = await asyncio.gather(*(producer.send(Message(topic, b"m%d" % i)) for i in range(120)))
        fifo = [await producer.send(Message("SpreadFifo", b"f%d" % i, message_group="order-7")) for i in range(20)]
    where = Counter(r.broker_name for r in receipts)
    assert set(where) == {"g0", "g1"} and min(where.values()) >= 30, where
    assert len({(r.broker_name, r.queue_id) for r in fifo}) == 1     # one message group, one queue
    fifo_group = fifo[0].broker_name
    assert await groups.stored_ids(fifo_group, "SpreadFifo") == [r.message_id for r in fifo]   # in order
    for group in ("g0", "g1"):
        stored = set(await groups.stored_ids(group, topic))
        assert {r.message_id for r in receipts if r.broker_name == group} <= stored

    wanted = {r.message_id: r.broker_name for r in receipts}
    got: dict[str, str] = {}
    async with SimpleConsumer(groups.addresses("g1")[1:2], "OurGroup", {topic: "*"}, await_duration_s=1) as consumer:
        deadline = time.monotonic() + 60
        while not set(wanted) <= set(got) and time.monotonic() < deadline:
            messages = await consumer.receive(32, invisible_duration=30)
            await consumer.ack(*messages)   # raises if any ack is refused (a handle sent to the wrong group)
            got.update((m.message_id, m.broker_name) for m in messages)
    assert set(wanted) <= set(got)
    assert all(got[m] == wanted[m] for m in wanted)              # received from (and acked to) its group
    # A pull consumer reads the queues of its servers' group (offsets are per group).
    async with PullConsumer(groups.addresses("g1")[:1], "OurPuller") as puller:
        assert await puller.queue_ids(topic) == [0, 1, 2, 3]
        first = await puller.pull(topic, 0, 0, max_messages=32)
    assert first.messages and {m.message_id for m in first.messages} <= \
        {m for m, g in wanted.items() if g == "g1"}


async def test_a_message_not_acknowledged_comes_back_from_its_own_group(groups):
    topic = "Retried"
    await groups.create_topic(topic, 1)
    await wait_route(groups, groups.addresses("g0")[0], topic, {"g0": [0], "g1": [0]})
    async with Producer(groups.addresses("g0")[:1]) as producer:
        sent = {(await producer.send(Message(topic, b"r%d" % i))).broker_name for i in range(4)}
    assert sent == {"g0", "g1"}
    first: dict[str, str] = {}
    async with SimpleConsumer(groups.addresses("g0")[:1], "RetryGroup", {topic: "*"},
                              await_duration_s=1) as consumer:
        deadline = time.monotonic() + 30
        while len(first) < 4 and time.monotonic() < deadline:
            for m in await consumer.receive(8, invisible_duration=30):
                first.setdefault(m.message_id, m.broker_name)
                await consumer.change_invisible_duration(m, 0)   # a nack, sent to its group: back at once
        again: dict[str, tuple[str, int]] = {}
        while len(again) < 4 and time.monotonic() < deadline:
            messages = await consumer.receive(8, invisible_duration=30)
            again.update((m.message_id, (m.broker_name, m.delivery_attempt)) for m in messages
                         if m.delivery_attempt > 1)
            await consumer.ack(*messages)
    assert set(first.values()) == {"g0", "g1"}
    assert {m: g for m, (g, _) in again.items()} == first                # redelivered by the group that has it


async def test_a_group_with_nothing_to_deliver_does_not_hold_up_a_receive(groups):
    """Every message goes to g1 only; a poll of g0 would wait the broker's
    minimum long polling time (5 s) for nothing. The consumer polls every
    group at once, so each message arrives at once (one poll at a time, in
    turn, made every other receive wait the 5 s out)."""
    topic = "OneSided"
    await groups.create_topic(topic, 1)
    await wait_route(groups, groups.addresses("g0")[0], topic, {"g0": [0], "g1": [0]})
    leader = groups.groups["g1"].addresses[await groups.leader("g1")]
    waits: list[float] = []
    async with grpc.aio.insecure_channel(leader) as channel, \
            SimpleConsumer(groups.addresses("g0")[:1], "OneSidedGroup", {topic: "*"},
                           await_duration_s=10) as consumer:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for i in range(4):
            message = pb.Message(topic=pb.Resource(name=topic), body=b"one-sided %d" % i,
                                 system_properties=pb.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(),
                                                                       born_host="127.0.0.1"))
            sent = await stub.SendMessage(spb.SendMessageRequest(messages=[message]), metadata=METADATA, timeout=10)
            assert sent.status.code == pb.OK, sent.status
            started = time.monotonic()
            received = []
            while not received and time.monotonic() - started < 15:
                received = await consumer.receive(8, invisible_duration=30)
            waits.append(time.monotonic() - started)
            assert [m.body for m in received] == [b"one-sided %d" % i] and received[0].broker_name == "g1"
            await consumer.ack(*received)
    assert max(waits) < 4.0, waits


async def test_concurrent_receives_keep_a_poll_each_at_every_group(groups):
    """Eight receives waiting at once on an empty topic: each keeps its own
    long poll at each group (16 in flight), as eight receives on one group
    keep eight; then eight messages, spread over both groups, are all handed out."""
    topic = "ManyPolls"
    await groups.create_topic(topic, 2)
    await wait_route(groups, groups.addresses("g0")[0], topic, {"g0": [0, 1], "g1": [0, 1]})
    async with SimpleConsumer(groups.addresses("g0")[:1], "ManyPollsGroup", {topic: "*"},
                              await_duration_s=20) as consumer:
        await consumer.receive(1, invisible_duration=30, await_duration_s=5)   # routes, groups greeted
        receives = [asyncio.ensure_future(consumer.receive(4, invisible_duration=30)) for _ in range(8)]
        await asyncio.sleep(0.5)
        in_flight = {group: len(polls) for (polled, group), polls in consumer._polls.items() if polled == topic}
        assert in_flight == {"g0": 8, "g1": 8}, in_flight
        async with Producer(groups.addresses("g0")[:1]) as producer:
            receipts = [await producer.send(Message(topic, b"poll %d" % i)) for i in range(8)]
        assert {r.broker_name for r in receipts} == {"g0", "g1"}
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < 8 and time.monotonic() < deadline:
            done, _ = await asyncio.wait(receives, timeout=1)
            for task in done:
                got.extend(task.result())
                receives.remove(task)
                receives.append(asyncio.ensure_future(consumer.receive(4, invisible_duration=30)))
        for task in receives:
            task.cancel()
        await asyncio.gather(*receives, return_exceptions=True)
        assert sorted(m.body for m in got) == sorted(b"poll %d" % i for i in range(8))
        await consumer.ack(*got)


async def test_our_client_looks_routes_up_at_a_name_server_and_skips_one_that_is_down(groups):
    down = f"127.0.0.1:{free_ports(1)[0]}"
    async with Producer(groups.addresses("g1")[:1], namesrv_addrs=(down, groups.namesrv.address)) as producer:
        receipts = [await producer.send(Message("Spread", b"n%d" % i)) for i in range(10)]
        assert {q.broker.name for q in (await producer.routes.route("Spread")).queues} == {"g0", "g1"}
    assert {r.broker_name for r in receipts} == {"g0", "g1"}


async def test_the_official_clients_producer_simple_and_push_consumers_use_both_groups(groups):
    await groups.create_topic("OfficialSpread", 2)
    await wait_route(groups, groups.addresses("g0")[0], "OfficialSpread", {"g0": [0, 1], "g1": [0, 1]})
    # The official client cannot share a process with our generated code
    # (both register apache.rocketmq.v2), so it runs in its own.
    script = textwrap.dedent(f"""
        import threading, time
        from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message,
                              MessageListener, Producer, PushConsumer, SimpleConsumer)
        config = ClientConfiguration({groups.addresses("g0")[0]!r}, Credentials())
        producer = Producer(config, ("OfficialSpread",))
        producer.startup()
        sent = set()
        try:
            for i in range(16):
                m = Message(); m.topic = "OfficialSpread"; m.body = b"official-%d" % i
                sent.add(producer.send(m).message_id)
        finally:
            producer.shutdown()
        print("SENT", " ".join(sorted(sent)))
        consumer = SimpleConsumer(config, "OfficialSpreadGroup", {{"OfficialSpread": FilterExpression()}},
                                  await_duration=5)
        consumer.startup()
        try:
            got = set()
            deadline = time.time() + 60
            while not sent <= got and time.time() < deadline:
                for message in consumer.receive(16, 15):
                    consumer.ack(message)
                    got.add(message.message_id)
            print("RECEIVED", " ".join(sorted(got)))
        finally:
            consumer.shutdown()
        # A PushConsumer of another group: QueryAssignment over both groups,
        # server-managed leases in each, its listener's results acked there.
        pushed, lock, done = set(), threading.Lock(), threading.Event()

        class Listener(MessageListener):
            def consume(self, message):
                with lock:
                    pushed.add(message.message_id)
                    if sent <= pushed:
                        done.set()
                return ConsumeResult.SUCCESS

        push = PushConsumer(config, "OfficialSpreadPushGroup", Listener(), {{"OfficialSpread": FilterExpression()}})
        push.startup()
        try:
            done.wait(60)
            with lock:
                print("PUSHED", " ".join(sorted(pushed)))
        finally:
            push.shutdown()
        """)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True,
                                   timeout=150, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith(("SENT", "RECEIVED", "PUSHED")))
    sent, received = set(lines["SENT"].split()), set(lines["RECEIVED"].split())
    pushed = set(lines.get("PUSHED", "").split())
    assert len(sent) == 16 and sent <= received
    assert sent <= pushed, f"the PushConsumer missed {len(sent - pushed)} of 16"
    stored = {g: set(await groups.stored_ids(g, "OfficialSpread")) for g in ("g0", "g1")}
    assert stored["g0"] and stored["g1"] and sent <= stored["g0"] | stored["g1"]
    print(f"official client: {len(sent & stored['g0'])} sends stored in g0, {len(sent & stored['g1'])} in g1")


async def test_killing_a_groups_leader_fails_no_send_and_the_group_takes_its_share_again(groups):
    topic = "Failover"
    await groups.create_topic(topic, 4)
    await wait_route(groups, groups.addresses("g1")[0], topic, {"g0": [0, 1, 2, 3], "g1": [0, 1, 2, 3]})
    g0 = groups.groups["g0"]
    victim = await groups.leader("g0")
    acked: list[tuple[float, SendReceipt]] = []
    failures: list[BaseException] = []
    async with Producer(groups.addresses("g1")) as producer:
        start = time.monotonic()
        stop_at = start + 9.0

        async def sender(worker: int) -> None:
            i = 0
            while time.monotonic() < stop_at:
                try:
                    receipt = await producer.send(Message(topic, b"w%d-%d" % (worker, i)))
                    acked.append((time.monotonic(), receipt))
                except ClientError as error:
                    failures.append(error)
                i += 1

        senders = [asyncio.ensure_future(sender(w)) for w in range(8)]
        await asyncio.sleep(1.5)
        g0.kill(victim)
        killed = time.monotonic()
        await asyncio.gather(*senders)
    try:
        assert failures == []
        before = Counter(r.broker_name for t, r in acked if t < killed)
        after = Counter(r.broker_name for t, r in acked if t > killed + 5.0)
        assert before["g0"] > 0 and before["g1"] > 0, before
        assert after["g0"] > 0 and after["g1"] > 0, after         # g0 took its share again
        print(f"sends before the kill {dict(before)}, from 5 s after it {dict(after)}; "
              f"retries {producer.connection.retries}")
        for group in ("g0", "g1"):
            stored = set(await groups.stored_ids(group, topic))
            lost = {r.message_id for _, r in acked if r.broker_name == group} - stored
            assert not lost, (group, len(lost))
    finally:
        g0.start(victim)
    await groups.wait_registered()


async def test_a_leader_change_is_seen_at_the_name_server_within_a_second(groups):
    old = await groups.leader("g0")
    deadline = time.monotonic() + 30
    async with DLedgerClient(groups.addresses("g0"), "g0") as client:
        while True:   # a node restarted by an earlier test may still be catching up: try the other
            target = [n for n in groups.groups["g0"].ids if n != old][int(time.monotonic()) % 2]
            try:
                await client.leadership_transfer(target)
                break
            except DLedgerError as error:
                assert time.monotonic() < deadline, error
                await asyncio.sleep(0.5)
    changed = time.monotonic()
    await groups.wait_registered(leaders={"g0": target}, timeout=1.0)
    print(f"new leader registered {time.monotonic() - changed:.2f} s after the transfer")


async def test_a_group_that_stops_registering_expires_and_comes_back(groups):
    g1 = groups.groups["g1"]
    for node in g1.ids:
        g1.pause(node)
    paused = time.monotonic()
    try:
        await groups.wait_registered(["g0"], timeout=EXPIRY_S + 3)
        assert time.monotonic() - paused > EXPIRY_S - REGISTER_INTERVAL_S - 0.5
        await wait_route(groups, groups.addresses("g0")[0], "Spread", {"g0": [0, 1, 2, 3]})
    finally:
        for node in g1.ids:
            g1.resume(node)
    await groups.wait_registered(timeout=15)
    await wait_route(groups, groups.addresses("g0")[0], "Spread", {"g0": [0, 1, 2, 3], "g1": [0, 1, 2, 3]})


async def test_a_name_server_restarted_empty_relearns_every_group_within_one_interval(groups):
    """(And while it is down, each node routes to its own group.)"""
    await groups.wait_registered()
    groups.namesrv.kill()
    # With no name server, a node answers with its own group's queues.
    route = await query_route(groups.addresses("g1")[0], "Spread")
    assert route.status.code == pb.OK and by_group(route.message_queues) == {"g1": [0, 1, 2, 3]}
    groups.namesrv.start()
    deadline = time.monotonic() + 30
    while True:   # the process takes a moment to start
        try:
            await groups.cluster_info()
            break
        except grpc.aio.AioRpcError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    answering = time.monotonic()
    # A leader whose registration failed tries again a second later (RETRY_S),
    # so the name server relearns every group within about a second of
    # answering, whatever the interval (30 s by default, 1 s here).
    await groups.wait_registered(timeout=RETRY_S + 1.0)
    print(f"relearned both groups {time.monotonic() - answering:.2f} s after it answered again")
