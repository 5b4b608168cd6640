"""A three-node cluster whose nodes each run a MessageStore on the replicated
log: real DLedgerServers and real store files, joined by the in-memory network."""
from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Awaitable, Callable

from store.codec import MessageExt
from store.config import MessageStoreConfig
from store.config_manager import ConfigManager
from store.message_store import MessageStore
from store.socket_address import SocketAddress
from store.topic_config import TopicConfig
from tests.unit.raft_harness import Cluster

SMALL_STORE = dict(consume_queue_units_per_file=64, index_hash_slots=64, index_items=256,
                   flush_interval_s=0.05, config_persist_interval_s=0.1, clean_interval_s=3600.0,
                   ready_wait_s=2.0)


# Three nodes and their stores share one event loop here; on a loaded machine
# the dledger harness's 100-200 ms election timeouts cause spurious elections.
STEADY = dict(heartbeat_interval_s=0.05, election_timeout_min_s=0.4, election_timeout_max_s=0.8,
              rpc_timeout_s=0.6, push_timeout_s=0.6)


class StoreCluster(Cluster):
    def __init__(self, base_dir: str, size: int = 3, store: dict | None = None,
                 managers: Callable[[str], list[ConfigManager]] | None = None, **overrides: object) -> None:
        super().__init__(base_dir, size, **{**STEADY, **overrides})
        self.store_settings = {**SMALL_STORE, **(store or {})}
        # Extra state machines per store, made from its config dir (as the broker adds its own).
        self.managers = managers
        self.stores: dict[str, MessageStore] = {}

    async def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.configs):
            await super().start(node_id)
            config = MessageStoreConfig(store_dir=os.path.join(self.configs[node_id].data_dir, "store"),
                                        **self.store_settings)  # type: ignore[arg-type]
            store = MessageStore(config, self.servers[node_id], SocketAddress("127.0.0.1", 30000 + int(node_id[1:])))
            for manager in self.managers(config.config_dir) if self.managers else []:
                store.add_manager(manager)
            await store.start()
            self.stores[node_id] = store

    async def stop(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.stores):
            store = self.stores.pop(node_id, None)
            if store is not None:
                await store.shutdown()
            await super().stop(node_id)

    def reconfigure_store(self, **changes: object) -> None:
        self.store_settings.update(changes)

    async def leader_store(self) -> MessageStore:
        return self.stores[await self.wait_leader()]

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        store = await self.leader_store()
        await store.update_topic(TopicConfig(topic, read_queue_nums=queues, write_queue_nums=queues))

    async def wait_snapshot(self, timeout: float = 5.0) -> None:
        """Every store has applied a metadata snapshot."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not all(s.snapshots.last_index >= 0 for s in self.stores.values()):
            if loop.time() > deadline:
                raise AssertionError("no metadata snapshot reached every store in time")
            await asyncio.sleep(0.02)

    async def wait_log_cut(self, nodes: list[str], past: int, timeout: float = 15.0,
                           feed: Callable[[], Awaitable[object]] | None = None) -> None:
        """Retention has deleted every entry up to `past` on each of `nodes`.
        Each node runs retention on its own timer (and a follower's floor
        moves with its own checkpoints), so a test that needs a node's log
        cut must wait for that node, not only the leader. `feed` writes more
        between checks, for retention that needs full segments to delete."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(self.servers[node].store.ledger_begin_index <= past for node in nodes):
            if loop.time() > deadline:
                begins = {node: self.servers[node].store.ledger_begin_index for node in nodes}
                raise AssertionError(f"retention did not delete entry {past} in time: logs begin at {begins}")
            if feed is not None:
                await feed()
            await asyncio.sleep(0.1)

    async def wait_applied(self, timeout: float = 5.0) -> None:
        """Every store has applied everything its node committed, and all agree."""
        await self.wait_converged(timeout=timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if all(s.applied_index >= self.servers[n].member_state.committed_index for n, s in self.stores.items()):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("stores did not apply the committed log in time")


def message(topic: str, body: bytes, queue_id: int = 0, tags: str | None = None, keys: str | None = None,
            uniq_key: str | None = None) -> MessageExt:
    properties: dict[str, str] = {}
    if tags:
        properties["TAGS"] = tags
    if keys:
        properties["KEYS"] = keys
    if uniq_key:
        properties["UNIQ_KEY"] = uniq_key
    return MessageExt(topic=topic, body=body, queue_id=queue_id, born_timestamp=1, properties=properties,
                      born_host=SocketAddress("127.0.0.1", 5555))


__all__ = ["StoreCluster", "message", "replace"]
