"""Two broker groups of three node processes each behind one name server,
on loopback: the fixture the broker-group tests share (one per module: six
nodes and a name server are heavy on a two-core machine)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from cluster.process_cluster import NameServerProcess, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from store import codec
from store.errors import MessageDecodeError
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc

# Short enough for tests: a group re-registers every second and is dropped
# after 4 s without one.
REGISTER_INTERVAL_S = 1.0
EXPIRY_S = 4.0


@dataclass
class GroupsCluster:
    base: Path
    group_count: int = 2
    namesrv: NameServerProcess = field(init=False)
    groups: dict[str, ProcessCluster] = field(init=False)

    def __post_init__(self) -> None:
        self.namesrv = NameServerProcess(self.base / "logs",
                                         ["--expiry", str(EXPIRY_S), "--scan-interval", "0.5"])
        self.groups = {}
        for g in range(self.group_count):
            name = f"g{g}"
            self.groups[name] = ProcessCluster(
                self.base / name, id_prefix=f"{name}n", log_dir=self.base / "logs",
                extra_args=["--group", name, "--namesrv-addrs", self.namesrv.address,
                            "--register-interval", str(REGISTER_INTERVAL_S)])

    def start(self) -> None:
        self.namesrv.start()
        for cluster in self.groups.values():
            cluster.start()

    def stop(self) -> None:
        for cluster in self.groups.values():
            cluster.stop_all()
        self.namesrv.stop()

    def addresses(self, group: str) -> list[str]:
        return list(self.groups[group].addresses.values())

    def servers(self, group: str | None = None) -> str:
        groups = [group] if group else list(self.groups)
        return ",".join(a for g in groups for a in self.addresses(g))

    async def leader(self, group: str, timeout: float = 20.0) -> str:
        async with DLedgerClient(self.addresses(group), group) as client:
            return await find_leader(client, self.addresses(group), timeout)

    async def cluster_info(self) -> npb.ClusterInfoResponse:
        async with grpc.aio.insecure_channel(self.namesrv.address) as channel:
            return await namesrv_pb2_grpc.NameServerStub(channel).ClusterInfo(npb.ClusterInfoRequest(), timeout=5)

    async def wait_registered(self, groups: list[str] | None = None, timeout: float = 30.0,
                              leaders: dict[str, str] | None = None) -> npb.ClusterInfoResponse:
        """Until the name server knows exactly `groups` (default: all),
        led by `leaders` where given."""
        wanted = sorted(groups if groups is not None else self.groups)
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = await self.cluster_info()
                names = sorted(g.broker_name for g in info.groups)
                led = {g.broker_name: g.leader_id for g in info.groups}
                if names == wanted and all(led.get(g) == n for g, n in (leaders or {}).items()):
                    return info
            except grpc.aio.AioRpcError:
                names = ["<name server down>"]
            assert time.monotonic() < deadline, f"name server knows {names}, not {wanted}"
            await asyncio.sleep(0.05)

    async def create_topic(self, topic: str, queues: int, groups: list[str] | None = None,
                           message_type: int = apb.NORMAL) -> None:
        for group in groups or list(self.groups):
            deadline = time.monotonic() + 30
            while True:
                async with grpc.aio.insecure_channel(self.addresses(group)[0]) as channel:
                    answer = await admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
                        apb.CreateTopicRequest(topic=topic, queue_count=queues, message_type=message_type),
                        timeout=15)
                if answer.status.code == pb.OK:
                    break
                assert answer.status.code == pb.HA_NOT_AVAILABLE and time.monotonic() < deadline, answer.status
                await asyncio.sleep(0.2)
        # Returned once a route lists every group (each leader registers the
        # topic a moment after creating it; a client's route is kept 30 s).
        from cluster.groups_cli import Group, wait_routed
        await wait_routed([Group(g, self.addresses(g)) for g in groups or list(self.groups)], topic)

    async def stored_ids(self, group: str, topic: str) -> list[str]:
        """The message ids of `topic` in `group`'s committed log, in log order
        (read with the DLedger client and the store's codec, not the broker)."""
        ids = []
        async with DLedgerClient(self.addresses(group), group) as client:
            async for entry in client.read():
                try:
                    message = codec.decode(entry.body)
                except MessageDecodeError:
                    continue  # a system entry
                if message.topic == topic:
                    ids.append(message.uniq_key or "")
        return ids
