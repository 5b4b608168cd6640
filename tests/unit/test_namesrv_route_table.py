"""The name server's rules (namesrv/route_table.py), with the time given."""
from __future__ import annotations

import pytest

from broker.errors import BrokerError
from namesrv.route_table import NodeInfo, Registration, RouteTable, TopicRouteData
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb


def nodes(group: str, leader: int = 0, base: int = 20000) -> tuple[NodeInfo, ...]:
    order = [leader] + [i for i in range(3) if i != leader]
    return tuple(NodeInfo(f"{group}n{i}", f"127.0.0.1:{base + i}", order.index(i),
                          "LEADER" if i == leader else "FOLLOWER") for i in range(3))


def registration(group: str = "g0", leader: int = 0, term: int = 1, topics: tuple[str, ...] = ("Orders",),
                 base: int = 20000, queues: int = 4) -> Registration:
    return Registration("DefaultCluster", group, f"{group}n{leader}", term, nodes(group, leader, base),
                        tuple(TopicRouteData(t, queues, queues, 6, "NORMAL") for t in topics))


def test_a_topic_held_by_two_groups_routes_to_both_by_broker_name():
    table = RouteTable(expiry_s=120)
    table.register(registration("g1", base=20010, topics=("Orders", "Only1")), now=0)
    table.register(registration("g0"), now=0)
    assert [g.broker_name for g, _ in table.route("Orders", now=1)] == ["g0", "g1"]
    assert [g.broker_name for g, _ in table.route("Only1", now=1)] == ["g1"]
    assert table.route("Unknown", now=1) == []


def test_a_group_not_heard_from_expires_and_comes_back_when_it_registers():
    table = RouteTable(expiry_s=5)
    table.register(registration("g0"), now=0)
    table.register(registration("g1", base=20010), now=0)
    table.register(registration("g1", base=20010), now=4)
    assert table.expire(now=5.5) == ["g0"]
    assert table.expired_total == 1
    assert [g.broker_name for g, _ in table.route("Orders", now=6)] == ["g1"]
    table.register(registration("g0"), now=7)
    assert [g.broker_name for g, _ in table.route("Orders", now=7)] == ["g0", "g1"]


def test_a_new_leader_takes_over_and_the_old_leaders_late_registration_loses():
    table = RouteTable()
    table.register(registration("g0", leader=0, term=3), now=0)
    table.register(registration("g0", leader=1, term=4), now=1)
    assert table.groups["g0"].leader_id == "g0n1"
    with pytest.raises(BrokerError) as refused:
        table.register(registration("g0", leader=0, term=3), now=2)
    assert refused.value.code == pb.FORBIDDEN and "stale" in refused.value.message
    assert table.groups["g0"].leader_id == "g0n1"


def test_two_leaders_in_one_term_are_refused():
    table = RouteTable()
    table.register(registration("g0", leader=0, term=3), now=0)
    with pytest.raises(BrokerError) as refused:
        table.register(registration("g0", leader=1, term=3), now=1)
    assert refused.value.code == pb.FORBIDDEN


def test_a_node_claiming_a_group_it_is_not_in_is_refused():
    table = RouteTable()
    table.register(registration("g0"), now=0)
    table.register(registration("g1", base=20010), now=0)
    # g1's leader, with its own address, claims to lead g0 (it lists itself).
    claim = Registration("DefaultCluster", "g0", "g1n0", 9,
                         (NodeInfo("g1n0", "127.0.0.1:20010", 0, "LEADER"),), ())
    with pytest.raises(BrokerError) as refused:
        table.register(claim, now=1)
    assert refused.value.code == pb.FORBIDDEN and "member of group 'g1'" in refused.value.message
    # A stranger with a new address and no member in common, even with a higher term.
    stranger = Registration("DefaultCluster", "g0", "x", 9, (NodeInfo("x", "127.0.0.1:30000", 0, "LEADER"),), ())
    with pytest.raises(BrokerError) as refused:
        table.register(stranger, now=1)
    assert "not a member of group 'g0'" in refused.value.message
    assert table.groups["g0"].leader_id == "g0n0"


def test_the_sender_must_be_listed_as_broker_id_zero():
    table = RouteTable()
    follower_claims = Registration("DefaultCluster", "g0", "g0n1", 1, nodes("g0", leader=0), ())
    with pytest.raises(BrokerError) as refused:
        table.register(follower_claims, now=0)
    assert refused.value.code == pb.FORBIDDEN
    assert table.groups == {}


@pytest.mark.parametrize("bad, words", [
    (dict(broker_name=""), "broker name"),
    (dict(broker_name="g 0"), "broker name"),
    (dict(cluster_name="a/b"), "cluster name"),
    (dict(term=-1), "negative"),
    (dict(nodes=()), "1..64 nodes"),
    (dict(topics=(TopicRouteData("bad topic", 1, 1, 6, "NORMAL"),)), "topic"),
    (dict(topics=(TopicRouteData("T", -1, 1, 6, "NORMAL"),)), "read queues"),
    (dict(topics=(TopicRouteData("T", 1, 5000, 6, "NORMAL"),)), "write queues"),
    (dict(topics=(TopicRouteData("T", 1, 1, 9, "NORMAL"),)), "permission"),
    (dict(topics=(TopicRouteData("T", 1, 1, 6, "WEIRD"),)), "message type"),
    (dict(topics=(TopicRouteData("T", 1, 1, 6, "FIFO"),) * 2), "twice"),
])
def test_malformed_registrations_are_refused_with_bad_request(bad, words):
    fields = registration().__dict__ | bad
    with pytest.raises(BrokerError) as refused:
        RouteTable().register(Registration(**fields), now=0)
    assert refused.value.code == pb.BAD_REQUEST and words in refused.value.message


def test_a_bad_node_address_is_refused():
    bad = Registration("C", "g0", "g0n0", 1, (NodeInfo("g0n0", "nohost", 0, "LEADER"),), ())
    with pytest.raises(BrokerError) as refused:
        RouteTable().register(bad, now=0)
    assert refused.value.code == pb.BAD_REQUEST and "HOST:PORT" in refused.value.message


def test_only_the_leader_of_the_current_term_unregisters_its_group():
    table = RouteTable()
    table.register(registration("g0", leader=1, term=5), now=0)
    assert not table.unregister("g0", "g0n0", 5)   # a follower shutting down
    assert not table.unregister("g0", "g0n1", 4)   # an older term
    assert not table.unregister("nope", "g0n1", 5)
    assert table.unregister("g0", "g0n1", 5)
    assert table.groups == {}
