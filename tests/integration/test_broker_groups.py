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
import time

import grpc
import pytest

from cluster.process_cluster import free_ports
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
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


async def test_a_leader_change_is_seen_at_the_name_server_within_a_second(groups):
    old = await groups.leader("g0")
    target = next(n for n in groups.groups["g0"].ids if n != old)
    async with DLedgerClient(groups.addresses("g0"), "g0") as client:
        await client.leadership_transfer(target)
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
    await groups.wait_registered()
    groups.namesrv.kill()
    groups.namesrv.start()
    restarted = time.monotonic()
    # One interval after it answers again (it takes a moment to start), plus the retry after a failed call.
    await groups.wait_registered(timeout=REGISTER_INTERVAL_S + 8)
    print(f"relearned both groups {time.monotonic() - restarted:.2f} s after the restart")
