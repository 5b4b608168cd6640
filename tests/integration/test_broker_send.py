"""The RocketMQ 5 protocol on three real node processes: routes from every node,
sends through any node (followers forward to the leader), a retried message id
answered with the original receipt, bad input answered with the protocol's
codes, and the official RocketMQ 5 Python client's Producer."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import grpc
import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
METADATA = [("x-mq-client-id", "test-client@1")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("broker"))
    c.start()
    yield c
    c.stop_all()


@pytest.fixture
async def stubs(cluster):
    client = DLedgerClient(list(cluster.addresses.values()))
    leader = await find_leader(client, list(cluster.addresses.values()))
    await client.close()
    channels = {node: grpc.aio.insecure_channel(address) for node, address in cluster.addresses.items()}
    yield leader, {node: service_pb2_grpc.MessagingServiceStub(ch) for node, ch in channels.items()}
    for channel in channels.values():
        await channel.close()


def message(topic: str, body: bytes = b"hello", **system: object) -> pb.Message:
    properties = pb.SystemProperties(message_id=system.pop("message_id", "01" + uuid.uuid4().hex.upper()),
                                     born_host="127.0.0.1", **system)  # type: ignore[arg-type]
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=properties)


async def send(stub, *messages: pb.Message, metadata=METADATA) -> spb.SendMessageResponse:
    return await stub.SendMessage(spb.SendMessageRequest(messages=list(messages)), metadata=metadata, timeout=10)


async def test_every_node_answers_a_route_listing_every_node(cluster, stubs):
    _, by_node = stubs
    for node, stub in by_node.items():
        route = await stub.QueryRoute(spb.QueryRouteRequest(
            topic=pb.Resource(name="RouteTopic"),
            endpoints=pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)])),
            metadata=METADATA, timeout=10)
        assert route.status.code == pb.OK, route.status.message
        assert len(route.message_queues) == 8
        queue = route.message_queues[0]
        assert queue.broker.id == 0 and queue.permission == pb.READ_WRITE
        assert sorted(f"{a.host}:{a.port}" for a in queue.broker.endpoints.addresses) == \
            sorted(cluster.addresses.values())


async def test_a_send_through_a_follower_is_stored_by_the_leader_and_a_retry_is_not(cluster, stubs):
    leader, by_node = stubs
    follower = next(n for n in by_node if n != leader)
    first = message("SendTopic", tag="TagA", keys=["k1"], message_type=pb.NORMAL)
    sent = await send(by_node[follower], first)
    assert sent.status.code == pb.OK, sent.status.message
    assert [e.message_id for e in sent.entries] == [first.system_properties.message_id]
    again = await send(by_node[leader], first)      # the producer's retry, same id
    assert again.entries[0].offset == sent.entries[0].offset
    batch = await send(by_node[leader], *[message("SendTopic", b"%d" % i) for i in range(10)])
    assert batch.status.code == pb.OK and len(batch.entries) == 10


@pytest.mark.parametrize("bad, code", [
    (lambda: message("bad topic!"), pb.ILLEGAL_TOPIC),
    (lambda: message("T", b""), pb.MESSAGE_BODY_EMPTY),
    (lambda: message("T", b"x" * (4 * 1024 * 1024 + 1)), pb.MESSAGE_BODY_TOO_LARGE),
    (lambda: message("T", tag="a||b"), pb.ILLEGAL_MESSAGE_TAG),
    (lambda: message("T", message_id="not-an-id"), pb.ILLEGAL_MESSAGE_ID),
    (lambda: message("T", message_group="g" * 64), pb.ILLEGAL_MESSAGE_GROUP),
    (lambda: message("%DLQ%group"), pb.ILLEGAL_TOPIC),
])
async def test_bad_sends_get_the_protocols_codes(stubs, bad, code):
    leader, by_node = stubs
    answer = await send(by_node[leader], bad())
    assert answer.status.code == code, answer.status.message
    assert answer.status.message


async def test_a_call_without_a_client_id_is_refused(stubs):
    leader, by_node = stubs
    answer = await send(by_node[leader], message("T"), metadata=[])
    assert answer.status.code == pb.CLIENT_ID_REQUIRED


def test_the_official_rocketmq_python_client_sends(cluster):
    # The official client cannot share a process with our generated code
    # (both register apache.rocketmq.v2), so it runs in its own.
    script = textwrap.dedent(f"""
        from rocketmq import ClientConfiguration, Credentials, Message, Producer
        producer = Producer(ClientConfiguration({';'.join(cluster.addresses.values())!r}, Credentials()), ("Official",))
        producer.startup()
        try:
            for i in range(5):
                m = Message(); m.topic = "Official"; m.body = b"official-%d" % i; m.tag = "TagA"; m.keys = "key%d" % i
                print("SENT", producer.send(m).message_id)
            fifo = Message(); fifo.topic = "Official"; fifo.body = b"fifo"; fifo.message_group = "g1"
            print("SENT", producer.send(fifo).message_id)
        finally:
            producer.shutdown()
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("SENT 01") == 6, done.stdout
