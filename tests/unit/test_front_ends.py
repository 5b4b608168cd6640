"""Front ends (cluster/front_end.py) and forwarded calls abandoned when the
leader moves (broker/forwarding.py): the rules as tables, the watch and the
port's lifecycle against real gRPC servers on loopback ports."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

import grpc
import pytest

from broker.forwarding import LeaderWatch, Target, leader_moved
from cluster import front_end
from cluster.front_end import FrontEnd, serves_clients
from cluster.process_cluster import free_ports



@pytest.mark.parametrize("is_leader, voters, open_", [
    (False, 3, True), (True, 3, False), (True, 2, False), (True, 1, True), (False, 1, True)])
def test_a_front_end_is_closed_only_while_its_node_leads_a_group_of_several(is_leader, voters, open_):
    assert serves_clients(is_leader, voters) is open_


@pytest.mark.parametrize("leader_id, term, moved", [
    ("n0", 5, False),    # the same leader, the same term: wait for its answer
    ("", 6, False),      # an election runs: the old leader may still answer
    ("n1", 6, True),     # another leader
    ("n0", 6, True),     # the same node elected again: its old term's writes failed
    ("n2", 5, True),     # (a view where another node leads the same term: follow it)
])
def test_a_forwarded_call_is_abandoned_only_once_another_leader_is_known(leader_id, term, moved):
    assert leader_moved(Target("127.0.0.1:1", "n0", 5), leader_id, term) is moved


@dataclass
class FakeMemberState:
    """What the watch and the front end read of dledger's MemberState."""
    leader_id: str = "n1"
    term: int = 3
    self_id: str = "n0"
    listeners: list[Callable[..., None]] = field(default_factory=list)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.self_id

    def add_listener(self, listener: Callable[..., None]) -> None:
        self.listeners.append(listener)

    def change(self, leader_id: str, term: int) -> None:
        self.leader_id, self.term = leader_id, term
        for listener in self.listeners:
            listener(None, term)


def test_the_watch_abandons_a_waiting_call_when_its_leader_moves_and_forgets_finished_ones():
    ms = FakeMemberState()
    watch = LeaderWatch(ms)  # type: ignore[arg-type]
    abandoned: list[str] = []
    with watch.guard(Target("a", "n1", 3), lambda: abandoned.append("first")):
        ms.change("", 4)                 # election: keep waiting
        assert abandoned == []
        ms.change("n2", 4)
        assert abandoned == ["first"]
    with watch.guard(Target("b", "n2", 4), lambda: abandoned.append("done")):
        pass
    ms.change("n0", 5)                   # the finished call is no longer watched
    assert abandoned == ["first"] and watch.abandoned == 1
    with watch.guard(Target("c", "n2", 4), lambda: abandoned.append("stale")):
        pass                             # forwarded on a view already out of date
    assert abandoned[-1] == "stale"


# ------------------------------------------------------------ the front end
@dataclass
class FakeMembership:
    voters: list[str]


@dataclass
class FakeServer:
    member_state: FakeMemberState
    membership: "FakeMembershipLog"


@dataclass
class FakeMembershipLog:
    current: FakeMembership


def named_server(address: str, name: bytes, hold: asyncio.Event | None = None,
                 held: asyncio.Event | None = None) -> grpc.aio.Server:
    """A bound server whose one method answers its name (which server a
    client's channel is on); with `hold` cleared, a call waits for it (a call
    held through an election), setting `held`."""
    async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if hold is not None and not hold.is_set():
            assert held is not None
            held.set()
            await hold.wait()
        return name

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Which", {"Name": grpc.unary_unary_rpc_method_handler(answer)})])
    assert server.add_insecure_port(address)
    return server


async def test_a_front_end_closes_when_its_node_leads_and_its_clients_move_without_a_failed_call(monkeypatch):
    """The official clients send one call at a time, and during an election
    their call is held: the port closes (GOAWAY) as the node becomes leader,
    before the held call is answered, so the next call goes to the next
    address. (Calls sent concurrently with the close, by a client that does
    not wait for answers, can still meet gRPC's shutdown and fail.)"""
    monkeypatch.setattr(front_end, "GOAWAY_NOTICE_S", 0.01)
    monkeypatch.setattr(front_end, "REBIND_INTERVAL_S", 0.2)
    port_a, port_b = sorted(free_ports(2))
    address_a, address_b = f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"
    ms = FakeMemberState()
    drained: list[bool] = []
    generations: list[Callable[[], bool]] = []
    elected, held = asyncio.Event(), asyncio.Event()
    elected.set()

    def build(draining: Callable[[], bool]) -> grpc.aio.Server:
        generations.append(draining)
        return named_server(address_a, b"A", elected, held)

    fe = FrontEnd(address_a, FakeServer(ms, FakeMembershipLog(FakeMembership(["n0", "n1", "n2"]))),  # type: ignore[arg-type]
                  build, drain_s=5.0, on_drain=lambda: drained.append(generations[-1]()))
    other = named_server(address_b, b"B")
    await other.start()
    await fe.start()
    # The official clients' channel: every address, the first that accepts.
    channel = grpc.aio.insecure_channel(f"ipv4:{address_a},{address_b}",
                                        options=[("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)])
    name = channel.unary_unary("/test.Which/Name")
    try:
        assert fe.open and await name(b"", timeout=2) == b"A"
        seen: list[bytes] = []
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                seen.append(await name(b"", timeout=5))
        running = asyncio.ensure_future(client())
        await asyncio.sleep(0.1)
        elected.clear()                  # the leader died: the next call is held
        await asyncio.wait_for(held.wait(), 2)
        ms.change("n0", 4)               # this node now leads: its front end closes
        await asyncio.sleep(0.02)        # the held call's next try comes round
        elected.set()
        await asyncio.sleep(0.3)
        assert not fe.open and fe.closed == 1
        assert drained == [True]         # long polls are told once the GOAWAY is out
        assert seen[-1] == b"B"
        ms.change("n1", 5)               # it follows again: the port opens anew
        await asyncio.sleep(0.5)
        stop.set()
        await running                    # a failed call would have raised here
        assert fe.open and fe.opened == 2 and len(seen) > 20
        async with grpc.aio.insecure_channel(address_a) as probe:
            assert await probe.unary_unary("/test.Which/Name")(b"", timeout=2) == b"A"
    finally:
        await channel.close()
        await fe.stop(0)
        await other.stop(0)


async def test_stopping_the_node_cuts_a_draining_front_end_short():
    port = free_ports(1)[0]
    address = f"127.0.0.1:{port}"
    ms = FakeMemberState()
    stalled = asyncio.get_running_loop().create_future()

    async def wait_forever(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await stalled          # a Telemetry stream, say: open until cut
        return b""

    def build(draining: Callable[[], bool]) -> grpc.aio.Server:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Which", {"Wait": grpc.unary_unary_rpc_method_handler(wait_forever)})])
        assert server.add_insecure_port(address)
        return server

    fe = FrontEnd(address, FakeServer(ms, FakeMembershipLog(FakeMembership(["n0", "n1", "n2"]))),  # type: ignore[arg-type]
                  build, drain_s=30.0, on_drain=lambda: None)
    await fe.start()
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary("/test.Which/Wait")(b"")
        await asyncio.sleep(0.2)
        ms.change("n0", 4)             # leads: draining for up to 30 s
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        await fe.stop(0.2)
        assert asyncio.get_running_loop().time() - started < 2.0
        with pytest.raises(grpc.aio.AioRpcError):
            await call
