"""Every messaging call maps to what RocketMQ 5's ACL 2.0 asks of it, and
every request type the mapping reads has the fields it reads."""
from __future__ import annotations

import pytest

from broker.auth.acl import Action, group, topic
from broker.auth.requirements import MESSAGING, REQUIREMENTS, telemetry_requirements
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

T, G = pb.Resource(name="orders"), pb.Resource(name="readers")
Q = pb.MessageQueue(topic=T)
PUB, SUB = (Action.PUB,), (Action.SUB,)
CASES = [
    ("QueryRoute", spb.QueryRouteRequest(topic=T), [((Action.PUB, Action.SUB), topic("orders"))]),
    ("SendMessage", spb.SendMessageRequest(messages=[pb.Message(topic=T), pb.Message(topic=T)]),
     [(PUB, topic("orders"))]),
    ("EndTransaction", spb.EndTransactionRequest(topic=T), [(PUB, topic("orders"))]),
    ("ReceiveMessage", spb.ReceiveMessageRequest(group=G, message_queue=Q),
     [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("AckMessage", spb.AckMessageRequest(group=G, topic=T), [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(group=G, topic=T),
     [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueRequest(group=G, topic=T),
     [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("QueryAssignment", spb.QueryAssignmentRequest(group=G, topic=T),
     [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("PullMessage", spb.PullMessageRequest(group=G, message_queue=Q),
     [(SUB, group("readers")), (SUB, topic("orders"))]),
    ("Heartbeat", spb.HeartbeatRequest(group=G), [(SUB, group("readers"))]),
    ("Heartbeat", spb.HeartbeatRequest(), []),
]


@pytest.mark.parametrize("method, request_, needs", CASES, ids=[c[0] for c in CASES])
def test_messaging_calls_need_what_rocketmq_asks(method: str, request_: object, needs: list) -> None:
    assert REQUIREMENTS[f"/{MESSAGING}/{method}"](request_) == needs


def test_every_messaging_method_is_mapped() -> None:
    methods = spb.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name
    missing = [m for m in methods if f"/{MESSAGING}/{m}" not in REQUIREMENTS]
    assert not missing


def test_telemetry_settings_need_the_producers_topics_or_the_consumers_group_and_topics() -> None:
    producer = spb.TelemetryCommand(settings=pb.Settings(publishing=pb.Publishing(topics=[T])))
    assert telemetry_requirements(producer) == [(PUB, topic("orders"))]
    consumer = spb.TelemetryCommand(settings=pb.Settings(subscription=pb.Subscription(
        group=G, subscriptions=[pb.SubscriptionEntry(topic=T)])))
    assert telemetry_requirements(consumer) == [(SUB, group("readers")), (SUB, topic("orders"))]


def test_every_method_of_every_service_of_ours_is_mapped() -> None:
    """An unmapped method is for super users only: that is safe, but a new
    method should be mapped on purpose."""
    from rpcgen import dledger_pb2
    from rpcgen.pydledger.admin.v1 import admin_pb2, operations_pb2
    from rpcgen.pydledger.auth.v1 import auth_pb2
    peer_only = {"Vote", "HeartBeat", "Push", "PeerStream"}
    for module in (dledger_pb2, admin_pb2, operations_pb2, auth_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            missing = [m for m in service.methods_by_name
                       if f"/{service.full_name}/{m}" not in REQUIREMENTS and m not in peer_only]
            assert not missing, (service.full_name, missing)
