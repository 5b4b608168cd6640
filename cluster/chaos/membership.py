"""Membership changes as a chaos fault (`member-change`): real node processes
added, removed, replaced and moved through the same client calls an operator
uses (`dledger member add|remove|replace`), while the workload appends and the
other faults go on; now and then the leader is SIGKILLed in the middle of the
change, so that the change is carried on (or dropped) by the next leader.

The actions, one per fault, chosen so that the group keeps between its
starting size and the number of ids the harness reserved (`--nodes` plus
spares):

- add: start a spare id with an empty data directory and `--join`, and add
  it (a learner, promoted once caught up);
- remove: remove a member (any, the leader included), then stop it and
  delete its data: its id may be added again later, as a new server;
- replace: a new server under a spare id takes a member's place
  (`replace_member` with a new id: added and promoted first, then the old
  one removed);
- move: a follower's machine dies (SIGKILL, its data deleted) and a new
  server takes its place under the same id at its second reserved address
  (`replace_member` without a new id, one configuration entry). The proxies
  in front of it follow it there only once the move is committed: before,
  the leader's link to the old address must stay dead, as it would.

After each change the harness takes the group's configuration from the
leader as the truth: a server the configuration does not name (an add that
never committed, a removed one) is stopped and its data deleted. Changes
are skipped while a storage fault's damage is unrepaired (a removal could
leave no majority with an intact copy). The checks are the run's usual
ones, on every member at the end: nothing acknowledged lost, no
divergence, no duplicate, every member caught up.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from cluster.chaos.history import FaultWindow, History
from cluster.chaos.network import FaultNetwork
from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

log = logging.getLogger(__name__)

ADD, REMOVE, REPLACE, MOVE = "add", "remove", "replace", "move"
# The share of changes with a leader SIGKILLed in their middle.
KILL_DURING_CHANGE = 0.35
# How long after the change is asked for the leader dies (uniform), and how
# long it stays down: a crash and a restart, as kill-leader does, so that a
# change that also takes a member down (a move) does not leave a minority
# up for the rest of the fault.
KILL_AFTER_S = (0.0, 0.4)
KILLED_FOR_S = 1.0
# One change, retries and a learner's catch-up included; the client's
# deadline for each of its calls (a leader kill makes them retry).
CHANGE_TIMEOUT_S = 30.0
CALL_DEADLINE_S = 20.0


@dataclass
class ChangeOutcome:
    action: str
    ok: bool = False
    error: str = ""
    killed: list[str] = field(default_factory=list)   # leaders SIGKILLed mid-change, to restart


def possible_actions(members: int, minimum: int, free_slots: int, movable: bool) -> list[str]:
    """What a change may do to a group of `members` servers that must keep
    at least `minimum`, with `free_slots` reserved ids unused."""
    actions = []
    if free_slots:
        actions += [ADD, REPLACE]
    if members > minimum:
        actions.append(REMOVE)
    if movable:
        actions.append(MOVE)
    return actions


class MembershipChanger:
    def __init__(self, cluster: ProcessCluster, network: FaultNetwork, history: History,
                 admin: DLedgerClient, find_leader: Callable[[random.Random], Awaitable[tuple[str, str]]],
                 current_leader: Callable[[], Awaitable[str | None]], minimum: int, silence_s: float) -> None:
        self.cluster = cluster
        self.network = network
        self.history = history
        self.admin = admin
        # The nemesis's: the leader (or a random node when none is found
        # soon), and the leader now (or None).
        self.find_leader = find_leader
        self.current_leader = current_leader
        self.minimum = minimum
        # How long a moved member's old process must have been silent
        # before the leader agrees to the move (dledger.server).
        self.silence_s = silence_s
        self.changes = 0
        self.completed = 0

    # -------------------------------------------------------------- start
    async def start(self, rng: random.Random, skip_reason: str) -> tuple[FaultWindow, Callable[[], Awaitable[None]]]:
        """Begin one change (it goes on in the background); returns its
        window and the heal, which waits for it and cleans up."""
        from cluster.chaos.schedule import MEMBER_CHANGE
        members = list(self.cluster.ids)
        movable = len(self.cluster.slots[members[0]]) > 1 and len(members) > 1
        actions = possible_actions(len(members), self.minimum, len(self.cluster.free_slots()), movable)
        if skip_reason or not actions:
            window = self.history.fault_started(MEMBER_CHANGE, (), f"skipped: {skip_reason or 'nothing to change'}")

            async def nothing() -> None:
                pass
            return window, nothing
        action = rng.choice(actions)
        kill_at = rng.uniform(*KILL_AFTER_S) if rng.random() < KILL_DURING_CHANGE else None
        leader, _ = await self.find_leader(rng)
        if action == ADD:
            target = rng.choice(self.cluster.free_slots())
            detail, change = f"add {target}", self._add(target)
        elif action == REMOVE:
            target = rng.choice(members)
            detail, change = f"remove {target}", self._remove(target)
        elif action == REPLACE:
            old, new = rng.choice(members), rng.choice(self.cluster.free_slots())
            target, detail, change = old, f"replace {old} by {new}", self._replace(old, new)
        else:
            target = rng.choice([m for m in members if m != leader] or members)
            detail, change = f"move {target} to a new machine and address", self._move(target)
        if kill_at is not None:
            detail += f"; the leader ({leader}) killed {kill_at:.2f}s into it"
        self.changes += 1
        window = self.history.fault_started(MEMBER_CHANGE, (target,), detail)
        outcome = ChangeOutcome(action)
        task = asyncio.ensure_future(self._run(change, outcome, kill_at))

        async def heal() -> None:
            try:
                await asyncio.wait_for(asyncio.shield(task), CHANGE_TIMEOUT_S)
            except asyncio.TimeoutError:
                outcome.error = outcome.error or f"not done within {CHANGE_TIMEOUT_S:.0f}s"
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            for node in outcome.killed:
                if node in self.cluster.ids and not self.cluster.running(node):
                    self.cluster.start(node)
            await self.reconcile()
            window.detail += "; done" if outcome.ok else f"; failed: {outcome.error}"
            self.completed += outcome.ok
        return window, heal

    async def _run(self, change: Awaitable[None], outcome: ChangeOutcome, kill_at: float | None) -> None:
        killer = asyncio.ensure_future(self._kill_leader_after(kill_at, outcome)) if kill_at is not None else None
        try:
            await change
            outcome.ok = True
        except (DLedgerError, TimeoutError) as error:
            outcome.error = str(error)
            log.warning("membership change failed: %s", error)
        finally:
            if killer is not None:
                await killer

    async def _kill_leader_after(self, seconds: float, outcome: ChangeOutcome) -> None:
        await asyncio.sleep(seconds)
        leader = await self.current_leader()
        if leader is None or not self.cluster.running(leader):
            return
        self.cluster.kill(leader)
        outcome.killed.append(leader)
        log.info("member-change: killed the leader %s mid-change", leader)
        await asyncio.sleep(KILLED_FOR_S)
        if leader in self.cluster.ids and not self.cluster.running(leader):
            self.cluster.start(leader)

    # ------------------------------------------------------------ actions
    def _client(self) -> DLedgerClient:
        """What an operator runs `dledger member ...` with: every address."""
        return DLedgerClient(self.cluster.every_address, deadline_s=CALL_DEADLINE_S)

    async def _add(self, node: str) -> None:
        address = self._start_new(node)
        async with self._client() as client:
            await client.add_member(node, address, wait_for_voter=True, timeout_s=CHANGE_TIMEOUT_S - 5)

    async def _remove(self, node: str) -> None:
        async with self._client() as client:
            await client.remove_member(node)
        self.cluster.forget_node(node)

    async def _replace(self, old: str, new: str) -> None:
        address = self._start_new(new)
        async with self._client() as client:
            await client.replace_member(old, address, new_id=new, timeout_s=CHANGE_TIMEOUT_S - 5)
        self.cluster.forget_node(old)

    async def _move(self, node: str) -> None:
        """The machine under `node` dies; a new one takes its id at another
        address. The links to it lead there once the move is committed (a
        failed move is undone by `reconcile`)."""
        if self.cluster.running(node):
            self.cluster.kill(node)
        self.cluster.wipe(node)
        address = self.cluster.move_node(node, [m for m in self.cluster.ids if m != node])
        await asyncio.sleep(self.silence_s)
        async with self._client() as client:
            await client.replace_member(node, address)
        self.network.retarget(node, address)

    def _start_new(self, node: str) -> str:
        """A new server (an empty disk) for a spare id, started with --join."""
        self.cluster.forget_node(node)   # whatever an earlier server under this id left
        address = self.cluster.add_node(node, [m for m in self.cluster.ids if m != node])
        self.network.retarget(node, address)
        return address

    # ---------------------------------------------------------- reconcile
    async def reconcile(self) -> None:
        """Take the leader's configuration as the truth: stop and wipe the
        servers it does not name. Leaves things as they are when no leader
        answers (the next change, or the end of the run, tries again)."""
        try:
            members = await self.admin.members()
        except DLedgerError as error:
            log.info("member-change: no configuration to reconcile with yet (%s)", error.message)
            return
        configured = {m["id"]: m["address"] for m in members}
        for node in [n for n in self.cluster.ids if n not in configured]:
            log.info("member-change: %s is not in the configuration: stopping it and deleting its data", node)
            self.cluster.forget_node(node)
        for node, address in configured.items():
            if node not in self.cluster.slots:
                continue
            if node not in self.cluster.ids:
                # A change that committed after the harness gave up on it.
                log.info("member-change: %s is in the configuration but not running: starting it", node)
                self.cluster.ids.append(node)
            elif self.cluster.addresses[node] == address:
                continue
            else:
                # A move that did not commit: the server goes back where the configuration says.
                log.info("member-change: %s runs at %s but is configured at %s: moving it back", node,
                         self.cluster.addresses[node], address)
                self.cluster.kill(node)
            self.cluster.addresses[node] = address
            self.cluster.joining[node] = [n for n in configured if n != node]
            self.network.retarget(node, address)
            self.cluster.start(node)
