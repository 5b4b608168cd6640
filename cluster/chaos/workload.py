"""Workloads: clients that load the cluster during a chaos run and record every
operation in the History.

The log workload: several concurrent clients (each with its own
DLedgerClient, so its own connections and its own producer id) append bodies
that each carry a unique id (`chaos:<client>-<n>`). Normally each client
appends one entry at a time at a bounded rate; in *heavy* mode (switched on by
the nemesis before a crash during writes) each client appends batches of
larger bodies back to back.

Appends are idempotent by default: the client library numbers each request
and retries an unknown outcome (a timeout, a broken connection, TERM_CHANGED,
a killed leader) with the same sequence number until its deadline, and the
group answers a repeat with the original indexes. So an operation ends ok or,
when the deadline passes first, unknown: after retries no answer proves that
no attempt was applied, so nothing is recorded as failed. The duplicate check
is what proves the retries harmless.

With `idempotent=False` (`dledger chaos --no-idempotence`) an append whose
outcome is unknown is never sent again: the library retries only answers that
prove the entry was not appended (NOT_LEADER and the like), and the last
answer decides: fail when it proves that, unknown otherwise.

The broker workload (sends and consumes through the RocketMQ 5 API) is in
broker_workload.py; `make_workload` builds either.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from cluster.chaos.history import History, Operation
from dledger.client import LEADER_MOVED, AppendResult, DLedgerClient, Stub
from dledger.errors import DLedgerError, ResponseCode
from rpcgen import dledger_pb2 as pb

log = logging.getLogger(__name__)

BODY_PREFIX = b"chaos:"
WORKLOADS = ("log", "broker")

# Answers that prove the append was not applied: retrying cannot duplicate,
# and the entries must never show up in the log.
NOT_APPLIED = LEADER_MOVED | {
    ResponseCode.LEADER_PENDING_FULL, ResponseCode.ENTRY_TOO_LARGE, ResponseCode.REQUEST_WITH_EMPTY_BODYS,
    ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.DISK_FULL, ResponseCode.UNKNOWN_GROUP,
}
# The client library may retry these by itself: the request was refused
# before anything was appended.
SAFE_TO_RETRY = LEADER_MOVED | {ResponseCode.LEADER_PENDING_FULL}


class WorkloadUnavailable(Exception):
    """The workload asked for cannot run yet."""


class Workload(Protocol):
    name: str

    async def run(self, stop: asyncio.Event) -> None:
        """Load the cluster until `stop` is set; record every operation."""

    def set_heavy(self, heavy: bool) -> None:
        """Switch to (or from) writing as fast and as much as possible."""

    async def barrier(self, deadline_s: float) -> int:
        """One acknowledged operation after the faults are healed; its index
        (TimeoutError when none is acknowledged within `deadline_s`)."""


@dataclass(frozen=True)
class LogWorkloadConfig:
    idempotent: bool = True
    clients: int = 5
    # Appends per second per client in normal mode: the machine is small and
    # shared, and the nodes must keep time for their heartbeats.
    rate_per_client: float = 25.0
    body_size: int = 64
    heavy_batch: int = 64
    heavy_body_size: int = 512
    # One append call: well above a normal commit (milliseconds) and below
    # a pause, so that a client stuck on a frozen leader gives up and finds
    # the new one (the library's default, 5 s, would hide the failover
    # behind the timeout).
    append_timeout_s: float = 1.5
    # One append's overall time, retries included: longer than any single
    # fault, so that an idempotent append rides a failover out.
    op_deadline_s: float = 10.0
    # After a failed or unknown append: don't spin while there is no leader.
    error_backoff_s: float = 0.05


def body_for(op_id: str, size: int) -> bytes:
    body = BODY_PREFIX + op_id.encode() + b" "
    return body + b"." * max(0, size - len(body))


def id_of(body: bytes) -> str | None:
    """The unique id a workload body carries, or None for a body no workload wrote."""
    if not body.startswith(BODY_PREFIX):
        return None
    return body[len(BODY_PREFIX):].split(b" ", 1)[0].decode("ascii", "replace")


def outcome_is_fail(error: DLedgerError) -> bool:
    return error.code in NOT_APPLIED


class SingleShotClient(DLedgerClient):
    """A DLedgerClient without a producer id whose appends are never sent
    twice once they may have been applied."""

    def __init__(self, servers: list[str], **options: float) -> None:
        super().__init__(servers, producer_id="", coalesce=False, **options)

    async def append_once(self, bodies: list[bytes]) -> AppendResult:
        request = pb.AppendRequest(header=self._header(), bodies=bodies)

        async def call(stub: Stub) -> pb.AppendResponse:
            return await stub.Append(request, timeout=self.append_timeout_s)

        response = await self._on_leader(call, SAFE_TO_RETRY)
        return AppendResult(response.first_index, response.last_index, list(response.positions))


class LogWorkload:
    name = "log"

    def __init__(self, servers: list[str], history: History, config: LogWorkloadConfig | None = None) -> None:
        self.servers = servers
        self.history = history
        self.config = config or LogWorkloadConfig()
        self.heavy = False
        self._sequence: dict[str, int] = {}

    def set_heavy(self, heavy: bool) -> None:
        self.heavy = heavy

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._client_loop(f"c{i}", stop) for i in range(self.config.clients)))

    async def barrier(self, deadline_s: float = 30.0) -> int:
        """Append until one is acknowledged (each try a new op with its own id)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline_s
        async with self._client() as client:
            while True:
                op = await self._append(client, "final", 1, self.config.body_size)
                if op.first_index is not None:
                    return op.first_index
                if loop.time() > give_up:
                    raise TimeoutError(f"no append acknowledged within {deadline_s}s after healing")
                await asyncio.sleep(0.2)

    def _client(self) -> DLedgerClient:
        timing = {"deadline_s": self.config.op_deadline_s, "append_timeout_s": self.config.append_timeout_s}
        if self.config.idempotent:
            return DLedgerClient(self.servers, **timing)  # a fresh random producer id
        return SingleShotClient(self.servers, **timing)

    async def _client_loop(self, name: str, stop: asyncio.Event) -> None:
        """Append until `stop`; an operation in flight then still completes."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        async with self._client() as client:
            while not stop.is_set():
                heavy = self.heavy
                count = self.config.heavy_batch if heavy else 1
                size = self.config.heavy_body_size if heavy else self.config.body_size
                op = await self._append(client, name, count, size)
                if op.first_index is None:
                    await asyncio.sleep(self.config.error_backoff_s)
                if not heavy:
                    # No catching up after a stall: a burst would distort the timeline.
                    next_at = max(next_at + 1.0 / self.config.rate_per_client, loop.time())
                    await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def _append(self, client: DLedgerClient, name: str, count: int, size: int) -> Operation:
        ids = tuple(self._next_id(name) for _ in range(count))
        bodies = [body_for(i, size) for i in ids]
        op = self.history.invoke(name, ids)
        try:
            if isinstance(client, SingleShotClient):
                result = await client.append_once(bodies)
            else:
                result = await client.append(bodies)
        except DLedgerError as error:
            if isinstance(client, SingleShotClient) and outcome_is_fail(error):
                self.history.fail(op, f"{error.code.name}: {error.message}")
            else:
                self.history.unknown(op, f"{error.code.name}: {error.message}")
        except asyncio.TimeoutError:
            self.history.unknown(op, "TIMEOUT: no answer")
        else:
            self.history.ok(op, result.first_index)
        return op

    def _next_id(self, name: str) -> str:
        n = self._sequence.get(name, 0)
        self._sequence[name] = n + 1
        return f"{name}-{n}"


def make_workload(name: str, servers: list[str], history: History, config: object | None = None) -> Workload:
    if name == "log":
        return LogWorkload(servers, history, config if isinstance(config, LogWorkloadConfig) else None)
    if name == "broker":
        from cluster.chaos.broker_workload import BrokerWorkload, BrokerWorkloadConfig
        return BrokerWorkload(servers, history, config if isinstance(config, BrokerWorkloadConfig) else None)
    raise WorkloadUnavailable(f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)}")
