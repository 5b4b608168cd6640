"""A cluster of real DLedgerServers (real file stores in a temp dir) joined by
the in-memory network: the Raft rules exercised without sockets, with fast timings."""
from __future__ import annotations

import asyncio
import os
import random
from dataclasses import replace

from dledger.config import DLedgerConfig, PeerAddress
from dledger.member_state import Role
from dledger.rpc.inmemory import InMemoryNetwork
from dledger.server import DLedgerServer

# Fast, but not twitchy: three nodes share one event loop here, and on a loaded
# machine a loop stall of a couple of hundred ms is ordinary.
FAST = dict(heartbeat_interval_s=0.04, election_timeout_min_s=0.3, election_timeout_max_s=0.6,
            rpc_timeout_s=0.5, push_timeout_s=0.5, follower_gap_timeout_s=0.5, max_wait_ack_s=2.0,
            commit_push_interval_s=0.1, data_file_size=64 * 1024, index_file_size=32 * 1024,
            checkpoint_interval_s=0.5, retention_check_interval_s=3600.0,
            leadership_transfer_timeout_s=2.0, preallocate=False, max_entry_size=16 * 1024)


class Cluster:
    def __init__(self, base_dir: str, size: int = 3, **overrides: object) -> None:
        self.base_dir = base_dir
        self.network = InMemoryNetwork()
        peers = tuple(PeerAddress(f"n{i}", "127.0.0.1", 30000 + i) for i in range(size))
        settings = {**FAST, **overrides}
        self.settings = settings
        self.configs = {p.id: DLedgerConfig(self_id=p.id, peers=peers, data_dir=os.path.join(base_dir, p.id),
                                            **settings) for p in peers}  # type: ignore[arg-type]
        self.servers: dict[str, DLedgerServer] = {}

    async def start(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.configs):
            server = DLedgerServer(self.configs[node_id], self.network.transport(node_id))
            assert server.elector is None
            self.servers[node_id] = server
            self.network.register(server)
            await server.start()
            assert server.elector is not None
            server.elector.rng = random.Random(hash(node_id) & 0xFFFF)

    async def stop(self, node: str | None = None) -> None:
        for node_id in [node] if node else list(self.servers):
            server = self.servers.pop(node_id, None)
            if server is not None:
                await server.shutdown()

    def add_joining_node(self, node: str) -> str:
        """A config for a new server started with --join: its peers are the
        current members (the servers running now) and itself. Returns its address."""
        peers = tuple(PeerAddress(n, "127.0.0.1", 30000 + int(n[1:])) for n in sorted({*self.servers, node}))
        self.configs[node] = DLedgerConfig(self_id=node, peers=peers, data_dir=os.path.join(self.base_dir, node),
                                           join=True, **self.settings)  # type: ignore[arg-type]
        return f"127.0.0.1:{30000 + int(node[1:])}"

    def reconfigure(self, node: str, **changes: object) -> None:
        self.configs[node] = replace(self.configs[node], **changes)  # type: ignore[arg-type]

    def leaders(self) -> list[str]:
        return [n for n, s in self.servers.items() if s.member_state.role is Role.LEADER]

    async def wait_leader(self, timeout: float = 5.0, among: list[str] | None = None,
                          min_term: int = 0) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            leaders = [n for n in self.leaders() if among is None or n in among]
            if len(leaders) == 1:
                leader = self.servers[leaders[0]]
                if leader.member_state.term >= min_term and leader.member_state.committed_index >= \
                        leader.store.ledger_end_index and leader.store.ledger_end_term == leader.member_state.term:
                    return leaders[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no single leader within {timeout}s: {self.describe()}")

    async def wait_converged(self, nodes: list[str] | None = None, timeout: float = 5.0) -> None:
        """Every node holds the same log and has committed all of it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        nodes = nodes or list(self.servers)
        while loop.time() < deadline:
            states = {(s.store.ledger_end_index, s.store.ledger_end_chain_crc, s.member_state.committed_index)
                      for n, s in self.servers.items() if n in nodes}
            if len(states) == 1:
                end, _, committed = next(iter(states))
                if end == committed:
                    return
            await asyncio.sleep(0.01)
        raise AssertionError(f"logs did not converge within {timeout}s: {self.describe()}")

    def describe(self) -> str:
        return "; ".join(f"{n}:{s.member_state.role.value}/t{s.member_state.term}"
                         f"/end{s.store.ledger_end_index}/c{s.member_state.committed_index}"
                         for n, s in sorted(self.servers.items()))

    def log_of(self, node: str) -> list[tuple[int, int, bytes]]:
        store = self.servers[node].store
        return [(e.index, e.term, e.body) for e in
                store.read_entries(store.ledger_begin_index, store.ledger_end_index, 1 << 30)]
