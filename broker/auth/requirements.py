"""What each call needs, as RocketMQ 5's proxy maps them (ACL 2.0):

- SendMessage, EndTransaction, RecallMessage: Pub on the topic;
- QueryRoute: Pub or Sub on the topic;
- ReceiveMessage, AckMessage, ChangeInvisibleDuration,
  ForwardMessageToDeadLetterQueue, QueryAssignment, PullMessage and the
  offset calls: Sub on the group and Sub on the topic;
- a consumer's Heartbeat and NotifyClientTermination: Sub on the group;
- Telemetry settings: Pub on a producer's topics, Sub on a consumer's group
  and topics (checked per settings command, `telemetry_requirements`);
- the admin service: Create/Update/Delete/List/Get on the topic or group;
  the operations service: Get on the topic for message queries, Get on the
  group to read its progress or dead letters, Update on the group to reset
  its offsets or resend to it;
  user and ACL administration: Update/Get/List on the Cluster;
- the log API: Append is Pub on the Cluster, Get and Read are Sub, Metadata
  is open to any signed user (clients find the leader with it), ListMembers
  is Get, ChangeMembership and LeadershipTransfer Update.

Each requirement is (actions, resource): any one of the actions on that
resource satisfies it; every requirement of a call must be satisfied.
Names are the names the broker stores (a namespaced topic's name is
`<ns>%<name>`, see broker/namespaces.py when it wraps them).
"""
from __future__ import annotations

from typing import Any, Callable

from broker.auth.acl import CLUSTER, Action, Resource, group, topic

Requirement = tuple[tuple[Action, ...], Resource]
Mapper = Callable[[Any], list[Requirement]]

PUB, SUB = (Action.PUB,), (Action.SUB,)
MESSAGING = "apache.rocketmq.v2.MessagingService"
ADMIN = "pydledger.admin.v1.AdminService"
OPERATIONS = "pydledger.admin.v1.OperationsService"
AUTH_ADMIN = "pydledger.auth.v1.AuthService"
LOG = "dledger.v1.DLedgerService"


def _topic(resource: Any) -> Resource:
    return topic(resource.name)


def _group(resource: Any) -> Resource:
    return group(resource.name)


def _consume(request: Any) -> list[Requirement]:
    """Sub on the request's group and topic (the topic of its queue for the
    calls that name a queue)."""
    has_queue = "message_queue" in request.DESCRIPTOR.fields_by_name
    resource = request.message_queue.topic if has_queue else request.topic
    return [(SUB, _group(request.group)), (SUB, _topic(resource))]


def _optional_group(request: Any) -> list[Requirement]:
    return [(SUB, _group(request.group))] if request.HasField("group") and request.group.name else []


def _send(request: Any) -> list[Requirement]:
    return [(PUB, t) for t in dict.fromkeys(_topic(m.topic) for m in request.messages)]


def _cluster(action: Action) -> Mapper:
    return lambda request: [((action,), CLUSTER)]


def _admin_topic(action: Action) -> Mapper:
    return lambda request: [((action,), topic(request.topic))]


def _admin_group(action: Action) -> Mapper:
    return lambda request: [((action,), group(request.group))]


def _lag(request: Any) -> list[Requirement]:
    needs: list[Requirement] = [((Action.GET,), group(request.group))]
    if request.topic:
        needs.append(((Action.GET,), topic(request.topic)))
    return needs


def _ops_topic(request: Any) -> list[Requirement]:
    """Message queries: Get on the topic (on the Cluster when none is named)."""
    return [((Action.GET,), topic(request.topic) if request.topic else CLUSTER)]


def _ops_group(action: Action) -> Mapper:
    def needs(request: Any) -> list[Requirement]:
        required: list[Requirement] = [((action,), group(request.group))]
        if getattr(request, "topic", ""):
            required.append(((Action.GET,), topic(request.topic)))
        return required
    return needs


REQUIREMENTS: dict[str, Mapper] = {
    f"/{MESSAGING}/QueryRoute": lambda r: [((Action.PUB, Action.SUB), _topic(r.topic))],
    f"/{MESSAGING}/Heartbeat": _optional_group,
    f"/{MESSAGING}/NotifyClientTermination": _optional_group,
    f"/{MESSAGING}/SendMessage": _send,
    f"/{MESSAGING}/EndTransaction": lambda r: [(PUB, _topic(r.topic))],
    f"/{MESSAGING}/RecallMessage": lambda r: [(PUB, _topic(r.topic))],
    f"/{MESSAGING}/ReceiveMessage": _consume,
    f"/{MESSAGING}/AckMessage": _consume,
    f"/{MESSAGING}/ChangeInvisibleDuration": _consume,
    f"/{MESSAGING}/ForwardMessageToDeadLetterQueue": _consume,
    f"/{MESSAGING}/QueryAssignment": _consume,
    f"/{MESSAGING}/PullMessage": _consume,
    f"/{MESSAGING}/UpdateOffset": _consume,
    f"/{MESSAGING}/GetOffset": _consume,
    f"/{MESSAGING}/QueryOffset": lambda r: [(SUB, _topic(r.message_queue.topic))],
    f"/{MESSAGING}/SyncLiteSubscription": _consume,
    # Telemetry: checked per command (telemetry_requirements).
    f"/{MESSAGING}/Telemetry": lambda r: [],
    f"/{ADMIN}/CreateTopic": _admin_topic(Action.CREATE),
    f"/{ADMIN}/UpdateTopic": _admin_topic(Action.UPDATE),
    f"/{ADMIN}/DeleteTopic": _admin_topic(Action.DELETE),
    f"/{ADMIN}/ListTopics": _cluster(Action.LIST),
    f"/{ADMIN}/CreateGroup": _admin_group(Action.CREATE),
    f"/{ADMIN}/UpdateGroup": _admin_group(Action.UPDATE),
    f"/{ADMIN}/ListGroups": _cluster(Action.LIST),
    f"/{ADMIN}/DescribeLag": _lag,
    f"/{ADMIN}/ListBrokerGroups": _cluster(Action.LIST),
    f"/{OPERATIONS}/QueryMessageByKey": _ops_topic,
    f"/{OPERATIONS}/QueryMessageById": _ops_topic,
    f"/{OPERATIONS}/QueryMessageByOffset": _ops_topic,
    f"/{OPERATIONS}/ResendMessage": _ops_group(Action.UPDATE),
    f"/{OPERATIONS}/GroupProgress": _ops_group(Action.GET),
    f"/{OPERATIONS}/ResetOffset": _ops_group(Action.UPDATE),
    f"/{OPERATIONS}/ListDeadLetters": _ops_group(Action.GET),
    f"/{OPERATIONS}/ResendDeadLetter": _ops_group(Action.UPDATE),
    f"/{OPERATIONS}/DescribeStore": _cluster(Action.GET),
    f"/{LOG}/Append": _cluster(Action.PUB),
    f"/{LOG}/AppendStream": _cluster(Action.PUB),
    f"/{LOG}/Get": _cluster(Action.SUB),
    f"/{LOG}/Read": _cluster(Action.SUB),
    # Any signed-in user: every client finds the leader with it (as QueryRoute).
    f"/{LOG}/Metadata": lambda r: [],
    f"/{LOG}/ListMembers": _cluster(Action.GET),
    f"/{LOG}/ChangeMembership": _cluster(Action.UPDATE),
    f"/{LOG}/LeadershipTransfer": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/CreateUser": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/UpdateUser": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/DeleteUser": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/ListUsers": _cluster(Action.LIST),
    f"/{AUTH_ADMIN}/CreateAcl": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/DeleteAcl": _cluster(Action.UPDATE),
    f"/{AUTH_ADMIN}/ListAcls": _cluster(Action.LIST),
}


def telemetry_requirements(command: Any) -> list[Requirement]:
    """A settings command declares what the client will do: a producer's
    topics need Pub, a consumer's group and topics Sub."""
    if not command.HasField("settings"):
        return []
    settings = command.settings
    if settings.HasField("publishing"):
        return [(PUB, _topic(t)) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        subscription = settings.subscription
        needs = [(SUB, _group(subscription.group))] if subscription.HasField("group") else []
        return needs + [(SUB, _topic(entry.topic)) for entry in subscription.subscriptions]
    return []
