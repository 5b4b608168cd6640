"""`dledger` over several broker groups: find every group from any nodes,
the status of all their nodes, and topic admin across groups.

A cluster's groups are found from the given servers: each one's own group
(DLedger Metadata names it, with its peers) and the groups its name servers
know (the admin service's ListBrokerGroups). With one group and no name
server this is exactly the group of the given servers.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import grpc

from broker.client import AdminClient, TopicInfo
from dledger.client import DLedgerClient
from dledger.rpc.credentials import ClientSecurity
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc

PROBE_TIMEOUT_S = 2.0


@dataclass
class Group:
    name: str
    addresses: list[str]


async def find_groups(servers: list[str]) -> list[Group]:
    """Every group reachable from `servers`, by name; [] when none answers."""
    found: dict[str, list[str]] = {}

    def add(name: str, addresses: list[str]) -> None:
        known = found.setdefault(name, [])
        known.extend(a for a in addresses if a and a not in known)

    async with DLedgerClient(servers, group="", probe_timeout_s=PROBE_TIMEOUT_S) as probe:
        answers = await asyncio.gather(*(probe.metadata(a) for a in servers), return_exceptions=True)
    for address, meta in zip(servers, answers):
        if meta is not None and not isinstance(meta, BaseException):
            add(meta.group, [address] + [p.address for p in meta.peers])
    for address in servers:
        groups = await _listed_groups(address)
        if groups is not None:
            for group in groups:
                add(group.name, list(group.addresses))
            break
    return [Group(name, addresses) for name, addresses in sorted(found.items())]


async def _listed_groups(address: str) -> list[apb.BrokerGroup] | None:
    try:
        async with ClientSecurity.from_env().channel(address) as channel:
            answer = await admin_pb2_grpc.AdminServiceStub(channel).ListBrokerGroups(
                apb.ListBrokerGroupsRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.aio.AioRpcError:
        return None
    return list(answer.groups) if answer.status.code == pb.OK else None


async def status_rows(servers: list[str], fallback_group: str) -> list[dict[str, Any]]:
    """`dledger status` rows of every node of every group. With several
    groups each row carries its "group"; with one, the rows are exactly
    what they always were (tools depend on their keys)."""
    groups = await find_groups(servers)
    if len(groups) <= 1:
        name = groups[0].name if groups else fallback_group
        async with DLedgerClient(servers, name) as client:
            return await client.cluster_status()
    rows: list[dict[str, Any]] = []
    for group in groups:
        async with DLedgerClient(group.addresses, group.name) as client:
            rows += [{**row, "group": group.name} for row in await client.cluster_status()]
    return rows


def select_groups(groups: list[Group], wanted: list[str] | None) -> list[Group]:
    if not wanted:
        return groups
    names = {g.name for g in groups}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(f"no broker group {unknown[0]!r} (groups: {', '.join(sorted(names))})")
    return [g for g in groups if g.name in wanted]


async def create_topic(groups: list[Group], topic: str, queues: int, message_type: str, permission: str,
                       wanted: list[str] | None) -> list[tuple[str, TopicInfo, bool]]:
    """Create the topic in each selected group: (group, topic, created)."""
    results = []
    selected = select_groups(groups, wanted)
    for group in selected:
        async with AdminClient(group.addresses) as admin:
            info, created = await admin.create_topic(topic, queues, message_type, permission)
        results.append((group.name, info, created))
    await wait_routed(selected, topic)
    return results


async def wait_routed(groups: list[Group], topic: str, timeout_s: float = 10.0) -> None:
    """Until a route of `topic` lists every one of `groups` (each group's
    leader registers a new topic with the name servers a moment after
    creating it; a client that looked the route up before would keep the
    partial route for its refresh interval). Gives up quietly at the timeout."""
    wanted = {g.name for g in groups}
    request = spb.QueryRouteRequest(topic=pb.Resource(name=topic), endpoints=pb.Endpoints(
        scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)]))
    deadline = time.monotonic() + timeout_s
    async with ClientSecurity.from_env().channel(groups[0].addresses[0]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        while time.monotonic() < deadline:
            try:
                route = await stub.QueryRoute(request, metadata=[("x-mq-client-id", "dledger-cli")],
                                              timeout=PROBE_TIMEOUT_S)
                if wanted <= {q.broker.name for q in route.message_queues}:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)


async def list_topics(groups: list[Group], include_system: bool) -> list[tuple[str, TopicInfo]]:
    """(group, topic) for every topic of every group."""
    results = []
    for group in groups:
        async with AdminClient(group.addresses) as admin:
            results += [(group.name, t) for t in await admin.list_topics(include_system)]
    return results


def merged_topic_json(topic: str, per_group: list[tuple[str, TopicInfo]]) -> dict[str, Any]:
    """One topic over several groups: totals, and where each queue lives."""
    first = per_group[0][1]
    return {"topic": topic, "queues": sum(t.queues for _, t in per_group), "type": first.message_type,
            "permission": first.permission, "system": first.system,
            "messages": sum(t.messages for _, t in per_group),
            "groups": [{"group": g, "queues": t.queues, "messages": t.messages,
                        "offsets": [{"queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset}
                                    for q in t.offsets]} for g, t in per_group]}


def by_topic(listed: list[tuple[str, TopicInfo]]) -> dict[str, list[tuple[str, TopicInfo]]]:
    topics: dict[str, list[tuple[str, TopicInfo]]] = {}
    for group, info in listed:
        topics.setdefault(info.topic, []).append((group, info))
    return dict(sorted(topics.items()))
