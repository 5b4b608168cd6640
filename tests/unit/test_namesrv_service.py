"""The name server's gRPC service on a real port: registration, routes,
cluster info, bad input answered with status codes, metrics."""
from __future__ import annotations

import urllib.request

import grpc
import pytest

from cluster.process_cluster import free_ports
from cluster.nameserver import NameServer, NameServerConfig
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc


def register_request(group: str, base: int, topics: tuple[str, ...] = ("Orders",), term: int = 1
                     ) -> npb.RegisterBrokerRequest:
    return npb.RegisterBrokerRequest(
        cluster_name="DefaultCluster", broker_name=group, node_id=f"{group}n0", term=term,
        nodes=[npb.BrokerNode(id=f"{group}n{i}", address=f"127.0.0.1:{base + i}", broker_id=i,
                              role="LEADER" if i == 0 else "FOLLOWER") for i in range(3)],
        topics=[npb.TopicRouteConfig(topic=t, read_queue_nums=4, write_queue_nums=4, perm=6,
                                     message_type="NORMAL") for t in topics])


@pytest.fixture
async def nameserver():
    port, metrics_port = free_ports(2)
    server = NameServer(NameServerConfig(listen=f"127.0.0.1:{port}", metrics_port=metrics_port))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield namesrv_pb2_grpc.NameServerStub(channel), metrics_port
    finally:
        await channel.close()
        await server.stop()


async def test_registered_groups_answer_routes_and_cluster_info(nameserver):
    stub, metrics_port = nameserver
    answer = await stub.RegisterBroker(register_request("g0", 20000, ("Orders", "TBW102")))
    assert answer.status.code == pb.OK and answer.expiry_ms == 120_000
    assert (await stub.RegisterBroker(register_request("g1", 20010))).status.code == pb.OK

    route = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="Orders"))
    assert route.status.code == pb.OK
    assert [(r.group.broker_name, r.group.leader_id, r.config.write_queue_nums) for r in route.routes] == \
        [("g0", "g0n0", 4), ("g1", "g1n0", 4)]
    assert [n.address for n in route.routes[1].group.nodes] == ["127.0.0.1:20010", "127.0.0.1:20011",
                                                                "127.0.0.1:20012"]
    default = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="TBW102"))
    assert [r.group.broker_name for r in default.routes] == ["g0"]
    missing = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="Nobody"))
    assert missing.status.code == pb.TOPIC_NOT_FOUND and not missing.routes

    info = await stub.ClusterInfo(npb.ClusterInfoRequest())
    assert [(g.broker_name, g.topic_count, len(g.nodes)) for g in info.groups] == [("g0", 2, 3), ("g1", 1, 3)]

    unregistered = await stub.UnregisterBroker(npb.UnregisterBrokerRequest(broker_name="g1", node_id="g1n0",
                                                                           term=1))
    assert unregistered.status.code == pb.OK and unregistered.removed
    info = await stub.ClusterInfo(npb.ClusterInfoRequest())
    assert [g.broker_name for g in info.groups] == ["g0"]

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert "dledger_namesrv_groups_registered 1.0" in text
    assert "dledger_namesrv_route_queries_total 3.0" in text
    assert "dledger_namesrv_expiries_total 0.0" in text


async def test_bad_input_is_answered_with_status_codes(nameserver):
    stub, _ = nameserver
    illegal = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="bad topic!"))
    assert illegal.status.code == pb.ILLEGAL_TOPIC
    blank = await stub.RouteByTopic(npb.RouteByTopicRequest(topic=""))
    assert blank.status.code == pb.ILLEGAL_TOPIC
    assert (await stub.RegisterBroker(register_request("g0", 20000))).status.code == pb.OK
    claim = register_request("g1", 20000)   # g0's addresses under another name
    refused = await stub.RegisterBroker(claim)
    assert refused.status.code == pb.FORBIDDEN and "member of group 'g0'" in refused.status.message
    nameless = await stub.RegisterBroker(register_request("", 20020))
    assert nameless.status.code == pb.BAD_REQUEST
    no_group = await stub.UnregisterBroker(npb.UnregisterBrokerRequest(broker_name="", node_id="x"))
    assert no_group.status.code == pb.BAD_REQUEST
