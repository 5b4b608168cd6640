"""Messaging links (broker/messaging_link.py, broker/client/link.py) against
three real node processes: our client's sends, receives and acks move onto
each node's link once it is open and are answered as on gRPC (the same
messages, the same refusals); a link cut under load loses and doubles no
send; on the wire, a link serves the messaging service's calls only, a
malformed call or one without a client id is answered and leaves the link
usable, a follower's link forwards to the leader, and a hello for a
service the node does not serve, or for another group, is refused; a client keeps a link's calls below what the node
reads."""
from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest

from broker.client import AdminClient, ClientError, Message, Producer, SimpleConsumer
from broker.client.link import MAX_CALLS_ON_A_LINK, SERVICE, MessagingLink
from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from dledger.rpc.link import LinkRefused, dial
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.pydledger.relay.v1 import relay_pb2 as rpb
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers, stored_messages
from tests.metrics_scrape import counter_total

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MESSAGING = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("messaging-link"), extra_args=SPARSE_FILES, metrics=True)
    c.start()
    yield c
    c.stop_all()


async def _create_topic(cluster: ProcessCluster, topic: str) -> None:
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(topic, 2, "normal")


async def _send_until_linked(producer: Producer, topic: str) -> int:
    """Warm-up sends until one went on the link; how many were sent."""
    for sent in range(1, 201):
        await producer.send(Message(topic, b"warm-up"))
        if producer.connection.links.calls_by_path["link"]:
            return sent
        await asyncio.sleep(0.02)
    raise AssertionError(f"no send moved to the link: {producer.connection.links.calls_by_path}")


async def _consume_until_linked(producer: Producer, consumer: SimpleConsumer, topic: str) -> None:
    """Warm-up messages sent, received and acked until the consumer's calls
    ride its link (none of them left unacked)."""
    for _ in range(100):
        await producer.send(Message(topic, b"warm-up"))
        batch = await consumer.receive(8, 30, await_duration_s=5)
        if batch:
            await consumer.ack(*batch)
        if consumer.connection.links.calls_by_path["link"] >= 2:
            return
    raise AssertionError(f"the consumer's calls never moved to its link: {consumer.connection.links.calls_by_path}")


async def test_sends_receives_and_acks_ride_the_link_and_are_answered_as_on_grpc(cluster):
    topic = f"Linked{uuid.uuid4().hex[:6]}"
    await _create_topic(cluster, topic)
    async with Producer(servers(cluster), [topic]) as producer:
        warm = await _send_until_linked(producer, topic)
        bodies = [f"m{i}".encode() for i in range(300)]
        await producer.send_batch([Message(topic, body) for body in bodies[:200]])
        await asyncio.gather(*(producer.send(Message(topic, body)) for body in bodies[200:]))
        sent_on_link = producer.connection.links.calls_by_path["link"]
        assert sent_on_link >= 2, producer.connection.links.calls_by_path

    received: dict[str, bytes] = {}
    async with SimpleConsumer(servers(cluster), f"G{topic}", {topic: "*"}) as consumer:
        deadline = time.monotonic() + 60
        while len(received) < warm + len(bodies) and time.monotonic() < deadline:
            batch = await consumer.receive(64, 30, await_duration_s=2)
            if batch:
                await consumer.ack(*batch)
            for message in batch:
                assert message.message_id not in received, "an acked message came back"
                received[message.message_id] = message.body
        assert not await consumer.receive(64, 30, await_duration_s=1), "acked messages came back"
        paths = consumer.connection.links.calls_by_path
        assert paths["link"] >= 3, paths   # receives and acks, after the first receive's dial
    assert sorted(b for b in received.values() if b != b"warm-up") == sorted(bodies)
    assert counter_total(cluster.metrics_ports.values(), "dledger_messaging_link_calls_total") >= sent_on_link + 3
    # Consumers at the tail read the leader's hot messages (store/hot_messages.py).
    hits = counter_total(cluster.metrics_ports.values(), "dledger_hot_message_reads_total", label='outcome="hit"')
    assert hits >= len(bodies), hits

    # A refusal is the same on either path: a plain message to a FIFO topic.
    fifo = f"Fifo{topic}"
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(fifo, 1, "fifo")
    errors = []
    for links in (True, False):
        async with Producer(servers(cluster), [topic, fifo], links=links) as producer:
            if links:
                await _send_until_linked(producer, topic)
            with pytest.raises(ClientError) as refused:
                await producer.send(Message(fifo, b"x"))
            errors.append(refused.value.code)
            assert bool(producer.connection.links.calls_by_path["link"]) == links
    assert errors[0] == errors[1], errors


async def test_a_client_given_one_follower_sends_on_the_leaders_own_link(cluster):
    # Only the leader's Metadata answer carries its link port: a client that
    # learned the leader from a follower's answer must still ask the leader.
    topic = f"OneFollower{uuid.uuid4().hex[:6]}"
    await _create_topic(cluster, topic)
    leader = cluster.addresses[await leader_of(cluster)]
    follower = next(address for address in cluster.addresses.values() if address != leader)
    async with Producer(follower, [topic]) as producer:
        links = producer.connection.links
        for _ in range(100):
            await producer.send(Message(topic, b"to the leader"))
            if links.get(leader) is not None:
                break
            await asyncio.sleep(0.02)
        assert producer.connection.known_leader == leader
        assert links.get(leader) is not None, "no link to the leader was ever opened"
        before = links.calls_by_path["link"]
        await asyncio.gather(*(producer.send(Message(topic, b"on the link")) for _ in range(20)))
        assert links.calls_by_path["link"] > before


async def test_a_link_cut_under_load_loses_and_doubles_no_send(cluster):
    topic = f"Cut{uuid.uuid4().hex[:6]}"
    await _create_topic(cluster, topic)
    acked: list[str] = []
    async with Producer(servers(cluster), [topic]) as producer:
        await _send_until_linked(producer, topic)
        links = producer.connection.links
        done = asyncio.Event()

        async def sender(n: int) -> None:
            for i in range(60):
                receipt = await producer.send(Message(topic, f"{n}-{i}".encode()))
                acked.append(receipt.message_id)

        async def cutter() -> None:
            while not done.is_set():
                await asyncio.sleep(0.05)
                for link in list(links._dialer.links.values()):
                    assert link._transport is not None
                    link._transport.abort()   # as a connection reset would

        cutting = asyncio.ensure_future(cutter())
        await asyncio.gather(*(sender(n) for n in range(8)))
        done.set()
        await cutting
        assert links._dialer.dials["opened"] >= 2, links._dialer.dials   # cut, and dialed again
    stored = [m.message_id for m in await stored_messages(cluster, topic)]
    assert len(stored) == len(set(stored)), "a send was stored twice"
    assert set(acked) <= set(stored)
    assert len(acked) == 480


async def _raw_link(cluster: ProcessCluster, group: str = "default", service: str = SERVICE,
                    follower: bool = False) -> MessagingLink:
    leader = await leader_of(cluster)
    node = cluster.addresses[next(n for n in cluster.addresses if n != leader) if follower else leader]
    async with DLedgerClient([node]) as client:
        metadata = await client.metadata(node)
    assert metadata is not None
    assert metadata.client_link_port, "the node names no client link port"
    return await dial(MessagingLink(lambda broken: None), f"127.0.0.1:{metadata.client_link_port}", "127.0.0.1",
                      group, "raw-probe", None, None, 5.0, service)


def _call(method: str, request: bytes, client_id: str = "raw-probe") -> rpb.RelayedCall:
    call = rpb.RelayedCall(method=method, request=request, timeout_s=10)
    if client_id:
        call.metadata.add(key="x-mq-client-id", value=client_id)
    return call


async def test_on_the_wire_a_link_serves_messaging_calls_only_and_survives_bad_ones(cluster):
    topic = f"Raw{uuid.uuid4().hex[:6]}"
    await _create_topic(cluster, topic)
    link = await _raw_link(cluster)
    try:
        other = await link.request(_call("/dledger.v1.DLedgerService/Metadata", b""), 10)
        assert other.code == grpc.StatusCode.UNIMPLEMENTED.value[0] and "messaging link" in other.details
        malformed = await link.request(_call(MESSAGING + "SendMessage", b"\xff\xff\xff"), 10)
        assert malformed.code != 0 and malformed.details
        route = spb.QueryRouteRequest(topic=pb.Resource(name=topic),
                                      endpoints=pb.Endpoints(addresses=[pb.Address(host="127.0.0.1", port=1)]))
        anonymous = await link.request(_call(MESSAGING + "QueryRoute", route.SerializeToString(), client_id=""), 10)
        assert spb.QueryRouteResponse.FromString(anonymous.response).status.code == pb.CLIENT_ID_REQUIRED
        answer = await link.request(_call(MESSAGING + "QueryRoute", route.SerializeToString()), 10)
        routed = spb.QueryRouteResponse.FromString(answer.response)
        assert answer.code == 0 and routed.status.code == pb.OK and len(routed.message_queues) >= 2
        assert link.broken is None
    finally:
        link.close("done")
    # A follower's link forwards to the leader, as its gRPC port does.
    link = await _raw_link(cluster, follower=True)
    try:
        message = pb.Message(topic=pb.Resource(name=topic), body=b"through a follower's link")
        system = message.system_properties
        system.message_id, system.body_encoding, system.message_type = uuid.uuid4().hex.upper(), pb.IDENTITY, pb.NORMAL
        system.born_host, system.born_timestamp.seconds = "127.0.0.1", int(time.time())
        send = spb.SendMessageRequest(messages=[message])
        answer = await link.request(_call(MESSAGING + "SendMessage", send.SerializeToString()), 10)
        sent = spb.SendMessageResponse.FromString(answer.response)
        assert answer.code == 0 and sent.status.code == pb.OK, sent
        assert system.message_id in [m.message_id for m in await stored_messages(cluster, topic)]
    finally:
        link.close("done")
    with pytest.raises(LinkRefused, match="serves no 'bogus' links"):
        await _raw_link(cluster, service="bogus")
    with pytest.raises(LinkRefused, match="not of 'elsewhere'"):
        await _raw_link(cluster, group="elsewhere")


async def test_a_receive_the_client_gave_up_on_is_withdrawn_and_leases_nothing(cluster):
    """The client stops waiting for a long poll (its task cancelled, as the
    watchdog does when the leader moves): the node cancels it, as gRPC
    cancels the call, instead of leasing the next message to nobody."""
    topic = f"Withdrawn{uuid.uuid4().hex[:6]}"
    async with AdminClient(servers(cluster)) as admin:
        await admin.create_topic(topic, 1, "normal")
    async with Producer(servers(cluster), [topic]) as producer, \
            SimpleConsumer(servers(cluster), f"G{topic}", {topic: "*"}) as consumer:
        await _consume_until_linked(producer, consumer, topic)
        before = consumer.connection.links.calls_by_path["link"]
        polling = asyncio.ensure_future(consumer.receive(1, 60, await_duration_s=8))
        await asyncio.sleep(1.0)
        assert consumer.connection.links.calls_by_path["link"] == before + 1   # the long poll, on the link
        polling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await polling
        await asyncio.sleep(0.5)
        sent = await producer.send(Message(topic, b"for whoever still waits"))
        received = await consumer.receive(1, 60, await_duration_s=5)
        assert [m.message_id for m in received] == [sent.message_id], \
            "the withdrawn long poll leased the message"


async def test_long_polls_beyond_a_links_share_go_on_grpc_and_leave_room_for_acks(cluster):
    """The node stops reading a link with 256 calls running: a client keeps
    at most MAX_CALLS_ON_A_LINK on one, so 150 waiting long polls leave
    room for its other calls."""
    topic = f"Polls{uuid.uuid4().hex[:6]}"
    await _create_topic(cluster, topic)
    async with Producer(servers(cluster), [topic]) as producer, \
            SimpleConsumer(servers(cluster), f"G{topic}", {topic: "*"}) as consumer:
        await _consume_until_linked(producer, consumer, topic)
        paths = consumer.connection.links.calls_by_path
        before = dict(paths)
        polls = [asyncio.ensure_future(consumer.receive(1, 30, await_duration_s=6)) for _ in range(150)]
        await asyncio.sleep(1.0)
        (link,) = consumer.connection.links._dialer.links.values()
        assert link.in_flight == MAX_CALLS_ON_A_LINK
        assert paths["grpc"] - before["grpc"] >= 150 - MAX_CALLS_ON_A_LINK
        # Meanwhile a message is delivered to one of them and acked at once.
        sent = await producer.send(Message(topic, b"while they wait"))
        started = time.monotonic()
        done, _ = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED, timeout=10)
        (got,) = [m for poll in done for m in poll.result()]
        assert got.message_id == sent.message_id
        await consumer.ack(got)
        assert time.monotonic() - started < 5
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        assert link.broken is None
