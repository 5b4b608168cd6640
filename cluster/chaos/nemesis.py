"""The nemesis: carries out a planned schedule against the node processes and
the fault network, and records each fault as a window in the History.

Each fault kind is a method that injects the fault and returns how to heal
it. A window starts once the fault is in place and ends when healing starts,
so that "acknowledged while the fault held" is exact.

Storage faults that destroy data (bit flips, a wiped disk) keep to a
minority: they hit a node only while at most f = (n-1)/2 nodes, that one
included, are without an intact log (repairing, or not yet rejoined). A
majority without the committed entries is data loss no replicated log can
undo; the promise under test is that a damaged minority repairs itself.

While the leader is isolated, a probe appends straight to it (not through
the client library, which would move to the new leader) once every 100 ms;
those operations go into the History under the client `probe-<node>`, and the
checker fails the run if any of them is acknowledged before the heal.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from itertools import permutations
from typing import Awaitable, Callable

import grpc

from cluster.chaos.history import PROBE_PREFIX, FaultWindow, History
from cluster.chaos.membership import MembershipChanger
from cluster.chaos.network import FaultNetwork, pairs_between
from cluster.chaos import disk
from cluster.chaos.schedule import (BITFLIP_RUNNING, BITFLIP_STOPPED, COMBO, CRASH_WRITE, DELAY, FSYNC_FAIL,
                                    ISOLATE_LEADER, KILL_LEADER, KILL_RANDOM, MEMBER_CHANGE, ONE_WAY,
                                    PAUSE_LEADER, SPLIT, TORN_TAIL, WIPE_DISK, PlannedFault)
from cluster.chaos.workload import NOT_APPLIED, Workload, body_for
from cluster.process_cluster import ProcessCluster
from dledger import failpoints
from dledger.client import DLedgerClient
from dledger.errors import ResponseCode
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 3.0
# How long to look for a leader before a "leader" fault picks a node at random.
LEADER_SEARCH_S = 3.0
# A scrubber pass over a chaos run's log (about 150 MiB at 8 MiB/s) takes
# about 20 s: a node's damage counts as unrepaired at least this long.
DAMAGE_FOUND_WITHIN_S = 30.0
# How long a node whose fdatasync failed may take to stop before the heal
# gives up waiting (a clean shutdown takes a second or two; a supervisor
# such as systemd restarts it once it has exited).
FATAL_STOP_WAIT_S = 15.0


@dataclass
class ActiveFault:
    window: FaultWindow
    heal: Callable[[], Awaitable[None]]


class Nemesis:
    def __init__(self, cluster: ProcessCluster, network: FaultNetwork, history: History,
                 workload: Workload, admin: DLedgerClient, move_silence_s: float = 2.5) -> None:
        self.cluster = cluster
        self.network = network
        self.history = history
        self.workload = workload
        self.admin = admin
        self._probe_count = 0
        # Nodes whose data a fault destroyed (and when), until they say they
        # are whole again: not before DAMAGE_FOUND_WITHIN_S, as a flipped bit
        # in a running node waits for its scrubber to come by.
        self._damaged: dict[str, float] = {}
        self._injectors: dict[str, Callable[[random.Random], Awaitable[ActiveFault]]] = {
            KILL_LEADER: self.kill_leader, KILL_RANDOM: self.kill_random, CRASH_WRITE: self.crash_write,
            ISOLATE_LEADER: self.isolate_leader, SPLIT: self.split, ONE_WAY: self.one_way,
            PAUSE_LEADER: self.pause_leader, DELAY: self.delay,
            BITFLIP_STOPPED: self.bitflip_stopped, BITFLIP_RUNNING: self.bitflip_running,
            TORN_TAIL: self.torn_tail, FSYNC_FAIL: self.fsync_fail, WIPE_DISK: self.wipe_disk,
            MEMBER_CHANGE: self.member_change,
        }
        self.membership = MembershipChanger(cluster, network, history, admin, self._leader_or_random,
                                            self._current_leader, minimum=len(cluster.ids),
                                            silence_s=move_silence_s)

    async def run(self, plan: list[PlannedFault]) -> None:
        for fault in plan:
            wait = fault.at_s - self.history.now()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.carry_out(fault)

    async def carry_out(self, fault: PlannedFault) -> None:
        rng = random.Random(fault.seed)
        if fault.kind == COMBO:
            first, second = fault.parts
            seeds = rng.getrandbits(32), rng.getrandbits(32)
            await asyncio.gather(
                self._hold(fault, first, random.Random(seeds[0]), 0.0, fault.duration_s),
                self._hold(fault, second, random.Random(seeds[1]), fault.stagger_s,
                           fault.duration_s - fault.stagger_s))
        else:
            await self._hold(fault, fault.kind, rng, 0.0, fault.duration_s)

    async def _hold(self, fault: PlannedFault, kind: str, rng: random.Random, after_s: float,
                    for_s: float) -> None:
        await asyncio.sleep(after_s)
        active = await self._injectors[kind](rng)
        active.window.group, active.window.in_combo = fault.number, fault.kind == COMBO
        log.info("fault %d %s on %s %s", active.window.number, kind, ",".join(active.window.targets),
                 active.window.detail)
        await asyncio.sleep(max(0.0, for_s))
        self.history.fault_ended(active.window)
        await active.heal()

    def heal_everything(self) -> None:
        """The safety net after the schedule: no link cut, no node down or paused."""
        self.network.heal_all()
        for node in list(self.cluster.paused):
            self.cluster.resume(node)
        for node in self.cluster.ids:
            if not self.cluster.running(node):
                self.cluster.start(node)

    # ---------------------------------------------------------- processes
    async def kill_leader(self, rng: random.Random) -> ActiveFault:
        node, how = await self._leader_or_random(rng)
        return self._kill(KILL_LEADER, node, how)

    async def kill_random(self, rng: random.Random) -> ActiveFault:
        return self._kill(KILL_RANDOM, rng.choice(self._running()), "")

    async def crash_write(self, rng: random.Random) -> ActiveFault:
        """SIGKILL the leader while every client appends big batches as fast as it can."""
        burst = rng.uniform(0.3, 1.0)
        self.workload.set_heavy(True)
        try:
            await asyncio.sleep(burst)
            node, how = await self._leader_or_random(rng)
            return self._kill(CRASH_WRITE, node, f"{how}after {burst:.2f}s of heavy appends".strip())
        finally:
            self.workload.set_heavy(False)

    def _kill(self, kind: str, node: str, detail: str) -> ActiveFault:
        self.cluster.kill(node)
        window = self.history.fault_started(kind, (node,), detail)
        return ActiveFault(window, self._restart(node))

    def _restart(self, node: str) -> Callable[[], Awaitable[None]]:
        """A heal that starts `node` again, unless a membership change
        removed it meanwhile (or it already runs)."""
        async def heal() -> None:
            if node in self.cluster.ids and not self.cluster.running(node):
                self.cluster.start(node)
        return heal

    # --------------------------------------------------------- membership
    async def member_change(self, rng: random.Random) -> ActiveFault:
        await self._forget_repaired(self._running())
        damaged = sorted(self._damaged)
        skip = f"{','.join(damaged)} not yet repaired (a removal could leave no intact majority)" if damaged else ""
        window, heal = await self.membership.start(rng, skip)
        return ActiveFault(window, heal)

    async def pause_leader(self, rng: random.Random) -> ActiveFault:
        node, how = await self._leader_or_random(rng)
        self.cluster.pause(node)
        window = self.history.fault_started(PAUSE_LEADER, (node,), how)

        async def heal() -> None:
            self.cluster.resume(node)
        return ActiveFault(window, heal)

    # ------------------------------------------------------------ storage
    async def _destroyable(self, kind: str, rng: random.Random) -> str | ActiveFault:
        """A running node whose data may be destroyed with the damaged nodes
        staying a minority, or (none) a window that says the fault was skipped."""
        running = self._running()
        now = await self._forget_repaired(running)
        tolerated = (len(self.cluster.ids) - 1) // 2
        eligible = [n for n in running if len(self._damaged.keys() | {n}) <= tolerated]
        if eligible:
            node = rng.choice(eligible)
            self._damaged[node] = now
            return node
        window = self.history.fault_started(kind, (), f"skipped: {','.join(sorted(self._damaged))} not yet "
                                                      "repaired (a majority would have no intact copy)")

        async def heal() -> None:
            pass
        return ActiveFault(window, heal)

    async def _forget_repaired(self, running: list[str]) -> float:
        """Drop from the damaged set the nodes that run, are not repairing and
        had time to find their damage; returns the history's now. (Only the
        storage faults refreshed it: a membership change drawn after a repair
        had finished was skipped as if the damage were still there.)"""
        answers = await asyncio.gather(*(self.admin.metadata(self.cluster.addresses[n]) for n in running))
        now = self.history.now()
        for node, meta in zip(running, answers):
            if meta is not None and not meta.repairing and meta.cluster_id \
                    and now - self._damaged.get(node, -DAMAGE_FOUND_WITHIN_S) >= DAMAGE_FOUND_WITHIN_S:
                self._damaged.pop(node, None)
        return now

    async def bitflip_stopped(self, rng: random.Random) -> ActiveFault:
        node = await self._destroyable(BITFLIP_STOPPED, rng)
        if isinstance(node, ActiveFault):
            return node
        index = await self._committed_entry(node, rng)
        self.cluster.kill(node)
        detail = self._flip(node, index, rng)
        return self._restart_at_heal(BITFLIP_STOPPED, node, detail)

    async def bitflip_running(self, rng: random.Random) -> ActiveFault:
        node = await self._destroyable(BITFLIP_RUNNING, rng)
        if isinstance(node, ActiveFault):
            return node
        index = await self._committed_entry(node, rng)
        window = self.history.fault_started(BITFLIP_RUNNING, (node,), self._flip(node, index, rng))

        async def heal() -> None:
            pass   # the node's scrubber finds it and the node repairs itself
        return ActiveFault(window, heal)

    async def torn_tail(self, rng: random.Random) -> ActiveFault:
        node = rng.choice(self._running())
        self.cluster.kill(node)
        torn = disk.tear_tail(disk.store_dir(self.cluster.base, node), self.cluster.failpoints_dir(node), rng)
        detail = ("nothing recorded as flushed yet" if torn is None else
                  f"fsynced to {torn.flushed}, written to {torn.written}, cut at {torn.cut} plus garbage")
        return self._restart_at_heal(TORN_TAIL, node, detail)

    async def fsync_fail(self, rng: random.Random) -> ActiveFault:
        node = rng.choice(self._running())
        self.cluster.arm_failpoint(node, failpoints.FSYNC)
        window = self.history.fault_started(FSYNC_FAIL, (node,), "its next fdatasync fails")

        async def heal() -> None:
            try:
                (self.cluster.failpoints_dir(node) / failpoints.FSYNC).unlink()
                fired = False
            except FileNotFoundError:
                fired = True   # the node removed it as it failed the fdatasync
            proc = self.cluster.procs.get(node)
            if proc is None:
                return
            if fired:
                # The node stops after a fatal disk error, but its clean
                # shutdown may outlast the fault's window: a heal that looked
                # once left it down until another fault restarted it (seed
                # 4711: 84 s, with another node wiped, no quorum for 71 s).
                deadline = asyncio.get_running_loop().time() + FATAL_STOP_WAIT_S
                while proc.poll() is None and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
            if proc.poll() is not None:
                window.detail += f"; it stopped (exit {proc.returncode})"
                self.cluster.procs.pop(node)
                if node in self.cluster.ids:
                    self.cluster.start(node)
        return ActiveFault(window, heal)

    async def wipe_disk(self, rng: random.Random) -> ActiveFault:
        node = await self._destroyable(WIPE_DISK, rng)
        if isinstance(node, ActiveFault):
            return node
        self.cluster.kill(node)
        disk.wipe(self.cluster.base, node, self.cluster.failpoints_dir(node))
        return self._restart_at_heal(WIPE_DISK, node, "its data directory is empty when it restarts")

    def _restart_at_heal(self, kind: str, node: str, detail: str) -> ActiveFault:
        window = self.history.fault_started(kind, (node,), detail)
        return ActiveFault(window, self._restart(node))

    async def _committed_entry(self, node: str, rng: random.Random) -> int:
        """A random entry that `node` holds and that is committed."""
        meta = await self.admin.metadata(self.cluster.addresses[node])
        if meta is None or meta.committed_index < meta.ledger_begin_index:
            return -1
        top = min(meta.committed_index, meta.flushed_index)
        return rng.randint(meta.ledger_begin_index, max(meta.ledger_begin_index, top))

    def _flip(self, node: str, index: int, rng: random.Random) -> str:
        if index < 0:
            return "no committed entry to damage"
        try:
            return disk.flip_entry(disk.store_dir(self.cluster.base, node), index, rng)
        except (OSError, ValueError) as error:
            return f"could not damage entry {index}: {error}"

    # ------------------------------------------------------------ network
    async def isolate_leader(self, rng: random.Random) -> ActiveFault:
        node, how = await self._leader_or_random(rng)
        others = [n for n in self.cluster.ids if n != node]
        pairs = pairs_between([node], others)
        for sender, receiver in pairs:
            self.network.drop(sender, receiver)
        window = self.history.fault_started(ISOLATE_LEADER, (node,), how)
        stop = asyncio.Event()
        probe = asyncio.ensure_future(self._probe(node, stop))

        async def heal() -> None:
            stop.set()
            for sender, receiver in pairs:
                self.network.undrop(sender, receiver)
            await probe
        return ActiveFault(window, heal)

    async def split(self, rng: random.Random) -> ActiveFault:
        nodes = list(self.cluster.ids)
        rng.shuffle(nodes)
        minority, majority = nodes[:len(nodes) // 2], nodes[len(nodes) // 2:]
        pairs = pairs_between(minority, majority)
        for sender, receiver in pairs:
            self.network.drop(sender, receiver)
        window = self.history.fault_started(SPLIT, tuple(sorted(minority)),
                                            f"minority {','.join(sorted(minority))} | "
                                            f"majority {','.join(sorted(majority))}")
        return ActiveFault(window, self._undrop_later(pairs))

    async def one_way(self, rng: random.Random) -> ActiveFault:
        """One node's outgoing bytes (or its incoming bytes) dropped, the
        other direction flowing; the node is the leader half of the time."""
        if rng.random() < 0.5:
            node, how = await self._leader_or_random(rng)
        else:
            node, how = rng.choice(self.cluster.ids), ""
        others = [n for n in self.cluster.ids if n != node]
        outgoing = rng.random() < 0.5
        pairs = [(node, o) for o in others] if outgoing else [(o, node) for o in others]
        for sender, receiver in pairs:
            self.network.drop(sender, receiver)
        detail = f"{how}{node} {'cannot send to' if outgoing else 'cannot hear'} {','.join(others)}"
        window = self.history.fault_started(ONE_WAY, (node,), detail)
        return ActiveFault(window, self._undrop_later(pairs))

    async def delay(self, rng: random.Random) -> ActiveFault:
        seconds = round(rng.uniform(0.02, 0.2), 3)
        pairs = list(permutations(self.cluster.ids, 2))
        for sender, receiver in pairs:
            self.network.delay(sender, receiver, seconds)
        window = self.history.fault_started(DELAY, tuple(self.cluster.ids), f"{seconds * 1000:.0f} ms each way")

        async def heal() -> None:
            for sender, receiver in pairs:
                self.network.undelay(sender, receiver, seconds)
        return ActiveFault(window, heal)

    def _undrop_later(self, pairs: list[tuple[str, str]]) -> Callable[[], Awaitable[None]]:
        async def heal() -> None:
            for sender, receiver in pairs:
                self.network.undrop(sender, receiver)
        return heal

    # ------------------------------------------------------------ helpers
    def _running(self) -> list[str]:
        return [n for n in self.cluster.ids if self.cluster.running(n)]

    async def _leader_or_random(self, rng: random.Random) -> tuple[str, str]:
        """The current leader (highest term among the nodes that say they
        lead), or a random running node when none is found: (node, note)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LEADER_SEARCH_S
        while loop.time() < give_up:
            leader = await self._current_leader()
            if leader is not None:
                return leader, ""
            await asyncio.sleep(0.05)
        candidates = [n for n in self._running() if n not in self.cluster.paused] or self._running()
        return rng.choice(candidates), "no leader found; chose at random; "

    async def _current_leader(self) -> str | None:
        nodes = [n for n in self._running() if n not in self.cluster.paused]
        answers = await asyncio.gather(*(self.admin.metadata(self.cluster.addresses[n]) for n in nodes))
        leaders = [(a.term, a.self_id) for a in answers if a is not None and a.role == "LEADER"]
        return max(leaders)[1] if leaders else None

    async def _probe(self, node: str, stop: asyncio.Event) -> None:
        """Append straight to `node` until `stop`; record every attempt."""
        # The harness's own credentials and CA, when it has any (DLEDGER_USER, ...).
        async with self.admin.security.channel(self.cluster.addresses[node]) as channel:
            stub = dledger_pb2_grpc.DLedgerServiceStub(channel)
            while not stop.is_set():
                await self._probe_once(node, stub)
                try:
                    await asyncio.wait_for(stop.wait(), PROBE_INTERVAL_S)
                except asyncio.TimeoutError:
                    pass

    async def _probe_once(self, node: str, stub: dledger_pb2_grpc.DLedgerServiceStub) -> None:
        self._probe_count += 1
        op_id = f"{PROBE_PREFIX}{self._probe_count}"
        op = self.history.invoke(f"{PROBE_PREFIX}{node}", (op_id,))
        request = pb.AppendRequest(header=pb.Header(group=self.admin.group), bodies=[body_for(op_id, 64)])
        try:
            response = await stub.Append(request, timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            self.history.unknown(op, f"{error.code().name}: {error.details()}")
            return
        code = ResponseCode.of(response.header.code)
        if code == ResponseCode.SUCCESS:
            self.history.ok(op, response.first_index)
        elif code in NOT_APPLIED:
            self.history.fail(op, f"{code.name}: {response.header.message}")
        else:
            self.history.unknown(op, f"{code.name}: {response.header.message}")
