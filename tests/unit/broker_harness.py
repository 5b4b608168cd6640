"""A three-node cluster whose nodes each run a MessageStore and a Broker on the
replicated log (real DLedgerServers and files, the in-memory network), with
one wall clock the test moves: timers and transaction checks without sleeps
on sockets."""
from __future__ import annotations

import asyncio
import os
import time
import uuid

from broker.broker import Broker
from broker.config import BrokerConfig
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store.config import MessageStoreConfig
from store.message_store import MessageStore
from store.socket_address import SocketAddress
from tests.unit.raft_harness import Cluster
from tests.unit.store_harness import SMALL_STORE, StoreCluster


class WallClock:
    """The brokers' wall clock in ms: real time (store timestamps are real)
    plus however far the test has moved it ahead."""

    def __init__(self) -> None:
        self.ahead_ms = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.ahead_ms

    def advance(self, ms: int) -> None:
        self.ahead_ms += ms


class BrokerCluster(StoreCluster):
    def __init__(self, base_dir: str, broker: dict | None = None, **overrides: object) -> None:
        super().__init__(base_dir, **overrides)  # type: ignore[arg-type]
        self.broker_settings = broker or {}
        self.brokers: dict[str, Broker] = {}
        self.clock = WallClock()

    async def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.configs):
            await Cluster.start(self, node_id)
            config = MessageStoreConfig(store_dir=os.path.join(self.configs[node_id].data_dir, "store"),
                                        **{**SMALL_STORE, **self.store_settings})  # type: ignore[arg-type]
            store = MessageStore(config, self.servers[node_id], SocketAddress("127.0.0.1", 30000 + int(node_id[1:])))
            broker = Broker(BrokerConfig("g", ("127.0.0.1:1",), **self.broker_settings), store,
                            self.servers[node_id])
            broker.timers.clock = broker.transactions.clock = self.clock
            await store.start()
            await broker.start()
            self.stores[node_id] = store
            self.brokers[node_id] = broker

    async def stop(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.brokers):
            broker = self.brokers.pop(node_id, None)
            if broker is not None:
                await broker.stop()
            await super().stop(node_id)

    async def leader_broker(self) -> Broker:
        return self.brokers[await self.wait_leader()]

    async def eventually(self, condition, timeout: float = 10.0, what: str = "condition") -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            if loop.time() > deadline:
                raise AssertionError(f"{what} did not hold within {timeout}s: {self.describe()}")
            await asyncio.sleep(0.02)


def new_message_id() -> str:
    return "01" + uuid.uuid4().hex.upper()


def protocol_message(topic: str, body: bytes, **system: object) -> pb.Message:
    user = system.pop("user", {})
    return pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=user,  # type: ignore[arg-type]
                      system_properties=pb.SystemProperties(message_id=new_message_id(), born_host="127.0.0.1",
                                                            **system))  # type: ignore[arg-type]
