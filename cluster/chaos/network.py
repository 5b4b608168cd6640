"""FaultNetwork: a LinkProxy for every ordered pair of nodes, controlled in
terms of nodes ("bytes from A to B are dropped") instead of proxy directions.

A message from A to B travels on two links: as a request on A's connection
to B (link A->B, forward) and as a reply on B's connection to A (link B->A,
backward). Dropping "A to B" drops both, so nothing A sends reaches B by
any path, while B's requests still reach A and take effect there (a one-way
partition: A hears B, B does not hear A, and neither completes an RPC
round trip with the other).

Faults are counted, so that two overlapping faults that both drop A->B heal
independently: the bytes flow again only once neither drops them.

A node serves peers on two ports: gRPC and its peer link (leaders' pushes
and heartbeats, dledger/rpc/peer_link.py). With `link_of` (each gRPC address
-> the link address of the node that listens there) every ordered pair gets
a second proxy in front of the link, and a fault acts on both.
"""
from __future__ import annotations

from collections import Counter
from itertools import permutations
from typing import Iterable

from cluster.chaos.proxy import LinkProxy, LinkState


class FaultNetwork:
    def __init__(self, addresses: dict[str, str], link_of: dict[str, str] | None = None) -> None:
        """`addresses`: each node's real (listening) address; `link_of`: the
        peer link's address for each address a node may listen on."""
        self.addresses = dict(addresses)
        self.link_of = dict(link_of or {})
        self.links = {(a, b): LinkProxy(a, b, addresses[b]) for a, b in permutations(addresses, 2)}
        self.peer_link_proxies = {(a, b): LinkProxy(a, b, self.link_of[addresses[b]])
                                  for a, b in permutations(addresses, 2) if addresses[b] in self.link_of}
        self._drops: Counter[tuple[str, str]] = Counter()
        self._delays: dict[tuple[str, str], list[float]] = {}

    @property
    def _proxies(self) -> list[LinkProxy]:
        return [*self.links.values(), *self.peer_link_proxies.values()]

    async def start(self) -> None:
        for link in self._proxies:
            await link.start()

    async def close(self) -> None:
        for link in self._proxies:
            await link.close()

    def routes(self, every_address: dict[str, list[str]] | None = None) -> dict[str, dict[str, str]]:
        """For each node, what it dials instead of another node's real
        address: the proxy of the link between them (`--peer-routes`).
        `every_address`: all the addresses each node may listen on (a node
        moved to a new address is reached through the same proxies)."""
        listening = every_address or {n: [a] for n, a in self.addresses.items()}
        routes: dict[str, dict[str, str]] = {a: {} for a in self.addresses}
        for a, b in permutations(self.addresses, 2):
            for address in listening[b]:
                routes[a][address] = self.links[(a, b)].address
                if address in self.link_of and (a, b) in self.peer_link_proxies:
                    routes[a][self.link_of[address]] = self.peer_link_proxies[(a, b)].address
        return routes

    def retarget(self, node: str, address: str) -> None:
        """`node` now listens at `address`: every link to it forwards there."""
        self.addresses[node] = address
        for (_, destination), link in self.links.items():
            if destination == node:
                link.retarget(address)
        for (_, destination), link in self.peer_link_proxies.items():
            if destination == node and address in self.link_of:
                link.retarget(self.link_of[address])

    # ------------------------------------------------------------- faults
    def drop(self, sender: str, receiver: str) -> None:
        self._drops[(sender, receiver)] += 1
        self._apply(sender, receiver)

    def undrop(self, sender: str, receiver: str) -> None:
        self._drops[(sender, receiver)] -= 1
        if self._drops[(sender, receiver)] <= 0:
            del self._drops[(sender, receiver)]
        self._apply(sender, receiver)

    def delay(self, sender: str, receiver: str, seconds: float) -> None:
        self._delays.setdefault((sender, receiver), []).append(seconds)
        self._apply(sender, receiver)

    def undelay(self, sender: str, receiver: str, seconds: float) -> None:
        delays = self._delays.get((sender, receiver), [])
        if seconds in delays:
            delays.remove(seconds)
        self._apply(sender, receiver)

    def heal_all(self) -> None:
        self._drops.clear()
        self._delays.clear()
        for link in self._proxies:
            link.heal()

    def dropped_pairs(self) -> list[tuple[str, str]]:
        return sorted(self._drops)

    def traffic(self) -> dict[str, int]:
        """Peer bytes carried and dropped so far, over every link."""
        return {"forwarded_bytes": sum(link.forwarded_bytes for link in self._proxies),
                "dropped_bytes": sum(link.dropped_bytes for link in self._proxies)}

    # ------------------------------------------------- derived link states
    def _apply(self, sender: str, receiver: str) -> None:
        """Recompute the two links a message from sender to receiver uses."""
        for pair in ((sender, receiver), (receiver, sender)):
            state = self._link_state(*pair)
            self.links[pair].set_state(state)
            if pair in self.peer_link_proxies:
                self.peer_link_proxies[pair].set_state(state)

    def _link_state(self, source: str, destination: str) -> LinkState:
        # Link source->destination: forward carries source's bytes to
        # destination, backward carries destination's bytes to source.
        return LinkState(
            drop_forward=self._drops[(source, destination)] > 0,
            drop_backward=self._drops[(destination, source)] > 0,
            delay_forward_s=max(self._delays.get((source, destination), []), default=0.0),
            delay_backward_s=max(self._delays.get((destination, source), []), default=0.0))


def pairs_between(group_a: Iterable[str], group_b: Iterable[str]) -> list[tuple[str, str]]:
    """Every (sender, receiver) pair across two groups, both ways."""
    a, b = list(group_a), list(group_b)
    return [(x, y) for x in a for y in b] + [(y, x) for x in a for y in b]
