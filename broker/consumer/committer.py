"""PopCommitter: the group commit of pop state changes, and the claims that
keep concurrent receives apart until their changes are applied.

Every receive, ack, ChangeInvisibleDuration and dead-lettering is a list of
pop ops that must be in the replicated log before the client hears of it.
Writing one system entry each would cost a log round trip per call; instead
ops that arrive while an append is under way ride together in the next one
(at most `max_in_flight` appends at a time), the way the log itself batches
flushes. Under load one entry carries the ops of many calls.

The entry is applied on every replica in log order, and on this node before
`commit` returns, so the caller reads the outcome from the pop state.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Iterable

from broker.consumer.pop_state import POP_OPS_KIND, Op, QueueKey
from broker.consumer.selection import QueueClaims
from store.errors import StoreUnavailableError
from store.message_store import MessageStore

log = logging.getLogger(__name__)

READY_POLL_S = 0.005


@dataclass
class _Batch:
    ops: list[dict[str, object]] = field(default_factory=list)
    waiters: list[asyncio.Future[int]] = field(default_factory=list)
    weight: int = 0


def op_weight(op: dict[str, object]) -> int:
    """About how many items an encoded op carries (offsets, acks, ...): the
    lists are what grows with a call's batch, at most ~30 bytes of JSON an
    item (an ack's [offset, lease], a redelivery's [offset, lease, attempt])."""
    return 1 + sum(len(value) for value in op.values() if isinstance(value, list))


class PopCommitter:
    def __init__(self, store: MessageStore, max_in_flight: int = 2, max_ops_per_entry: int = 1000,
                 ready_wait_s: float = 2.0, max_weight_per_entry: int = 100_000) -> None:
        self.store = store
        self.max_in_flight = max_in_flight
        self.ready_wait_s = ready_wait_s
        # An entry's ops, and their items (op_weight): 100,000 items are at
        # most about 3 MB of JSON, below the log's 4 MiB entry limit however
        # large the calls' batches (a receive of 128, an ack of 1,000 entries
        # on one queue: 22 KB, of which a thousand would not fit).
        self.max_ops_per_entry = max_ops_per_entry
        self.max_weight_per_entry = max_weight_per_entry
        self._pending: list[_Batch] = []
        self._in_flight = 0
        self._starting = 0          # appends started whose task has not taken its batch yet
        self._tasks: set[asyncio.Task[None]] = set()
        self.entries = 0        # counters for the benchmark and metrics
        self.ops = 0

    async def ready(self) -> None:
        """Return once this node leads and has applied the log up to the start
        of its term, so that decisions read a pop state no older than any
        previous leader's; StoreUnavailableError (the client retries) if it
        does not lead or does not get there in time."""
        server = self.store.server
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_wait_s
        while (ready_from := server.leader_ready_from()) is None:
            state = server.member_state
            if not state.is_leader or loop.time() >= deadline:
                where = f"the leader is {state.leader_id}" if state.leader_id else "no leader yet"
                raise StoreUnavailableError(f"{server.config.self_id} does not serve consumers now; {where}",
                                            state.leader_id or "", state.leader_address or "")
            await asyncio.sleep(READY_POLL_S)
        reput = self.store.reput
        if self.store.applied_index < ready_from and (
                reput is None or not await reput.wait_applied(ready_from, max(0.0, deadline - loop.time()))):
            raise StoreUnavailableError(f"this new leader is still applying the log (at {self.store.applied_index}, "
                                        f"its term starts at {ready_from})")

    async def commit(self, ops: Iterable[Op]) -> int:
        """Write `ops` through the log; returns the index of the entry that
        carried them, once this node has applied it."""
        return await asyncio.shield(self.submit(ops))

    def submit(self, ops: Iterable[Op]) -> asyncio.Future[int]:
        """commit(), queued now: the future is the entry's index once this
        node has applied it (or the append's error), whoever still waits."""
        encoded = [op.to_json() for op in ops]
        weight = sum(op_weight(op) for op in encoded)
        last = self._pending[-1] if self._pending else None
        if last is None or len(last.ops) + len(encoded) > self.max_ops_per_entry or \
                (last.ops and last.weight + weight > self.max_weight_per_entry):
            self._pending.append(_Batch())
        batch = self._pending[-1]
        batch.ops.extend(encoded)
        batch.weight += weight
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        batch.waiters.append(waiter)
        self._start_appends()
        return waiter

    def _start_appends(self) -> None:
        # A started append takes its batch when its task first runs, a loop
        # turn later: the ops submitted in this turn (the acks of one relay
        # message, say) join that batch instead of starting entries of their own.
        while len(self._pending) > self._starting and self._in_flight < self.max_in_flight:
            self._in_flight += 1
            self._starting += 1
            task = asyncio.ensure_future(self._append())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _append(self) -> None:
        self._starting -= 1
        batch = self._pending.pop(0)
        try:
            index = await self.store.append_system_entry(POP_OPS_KIND, {"ops": batch.ops})
        except Exception as error:  # noqa: BLE001 - every caller of the batch shares the failure
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
                    waiter.exception()  # retrieved: its caller may have been cancelled meanwhile
        else:
            self.entries += 1
            self.ops += len(batch.ops)
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_result(index)
        finally:
            self._in_flight -= 1
            self._start_appends()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class ClaimTable:
    """Leader-local: what receives whose entries are not applied yet took,
    per queue (see selection.QueueClaims)."""

    def __init__(self) -> None:
        self._claims: dict[QueueKey, QueueClaims] = {}

    def get(self, key: QueueKey) -> QueueClaims | None:
        return self._claims.get(key)

    def hold(self, key: QueueKey, scan_end: int | None, offsets: Iterable[int], groups: Iterable[str]) -> None:
        claims = self._claims.setdefault(key, QueueClaims())
        if scan_end is not None:
            claims.scans += 1
            claims.frontier = scan_end
        claims.offsets.update(offsets)
        claims.groups.update(groups)

    def release(self, key: QueueKey, scan_end: int | None, offsets: Iterable[int], groups: Iterable[str]) -> None:
        claims = self._claims.get(key)
        if claims is None:
            return
        if scan_end is not None:
            claims.scans -= 1
            if claims.scans <= 0:
                # Nothing pending: the applied pop state is the frontier again
                # (after a failed append too, so that nothing is skipped).
                claims.scans, claims.frontier = 0, None
        claims.offsets.difference_update(offsets)
        claims.groups.subtract(groups)
        if not claims.scans and not claims.offsets and not +claims.groups:
            del self._claims[key]

    def clear(self) -> None:
        self._claims.clear()
