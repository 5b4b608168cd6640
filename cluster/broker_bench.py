"""`dledger bench send` and `bench consume`: the broker's throughput through broker.client.

send: K workers share one Producer (one HTTP/2 connection to the leader);
each loops "send B messages of SIZE bytes, wait for the receipts" for the
duration. B = 1 is a single send (the producer still lets concurrent sends
share calls, as a Kafka producer batches records; `coalesce=False` makes one
call per send); B > 1 is an explicit batch. Latency is per call, send to
receipt (commit by a majority).

consume: N messages are sent first, then K receivers share one
SimpleConsumer, each looping "receive up to B, ack them all (one batched
AckMessage call)" until N are acknowledged. A fresh consumer group each run
(unless one is named), so that earlier runs' progress does not count.
"""
from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from broker.client import AdminClient, ClientError, Message, Producer, SimpleConsumer

ERROR_PAUSE_S = 0.05
PREFILL_INFLIGHT = 8
PREFILL_BATCH = 500


def percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


@dataclass
class SendBenchResult:
    size: int
    inflight: int
    batch: int
    coalesce: bool
    duration_s: float = 0.0
    messages: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, float | int | bool | str]:
        elapsed = self.duration_s or math.inf
        ordered = sorted(self.latencies_s)
        return {"mode": "send", "size": self.size, "inflight": self.inflight, "batch": self.batch,
                "coalesce": self.coalesce, "duration_s": round(self.duration_s, 3), "messages": self.messages,
                "messages_per_s": round(self.messages / elapsed, 1),
                "mb_per_s": round(self.messages * self.size / elapsed / 1e6, 3),
                "p50_ms": round(percentile(ordered, 0.50) * 1000, 3),
                "p99_ms": round(percentile(ordered, 0.99) * 1000, 3),
                "errors": sum(self.errors.values())}


@dataclass
class ConsumeBenchResult:
    size: int
    inflight: int
    batch: int
    duration_s: float = 0.0
    messages: int = 0
    receive_latencies_s: list[float] = field(default_factory=list)
    ack_latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, float | int | str]:
        elapsed = self.duration_s or math.inf
        receives, acks = sorted(self.receive_latencies_s), sorted(self.ack_latencies_s)
        return {"mode": "consume", "size": self.size, "inflight": self.inflight, "batch": self.batch,
                "duration_s": round(self.duration_s, 3), "messages": self.messages,
                "acked_per_s": round(self.messages / elapsed, 1),
                "mb_per_s": round(self.messages * self.size / elapsed / 1e6, 3),
                "p50_receive_ms": round(percentile(receives, 0.50) * 1000, 3),
                "p99_receive_ms": round(percentile(receives, 0.99) * 1000, 3),
                "p50_ack_ms": round(percentile(acks, 0.50) * 1000, 3),
                "p99_ack_ms": round(percentile(acks, 0.99) * 1000, 3),
                "errors": sum(self.errors.values())}


async def ensure_topic(servers: list[str] | str, topic: str) -> None:
    """A NORMAL topic for the bench (an existing one of any shape is used as
    it is), in every broker group the servers lead to."""
    from cluster.groups_cli import find_groups, wait_routed

    listed = [servers] if isinstance(servers, str) else list(servers)
    groups = await find_groups([a for item in listed for a in item.split(",") if a])
    for addresses in [g.addresses for g in groups] if len(groups) > 1 else [servers]:
        async with AdminClient(addresses) as admin:
            try:
                await admin.create_topic(topic, message_type="normal")
            except ClientError as error:
                if "exists" not in error.message:
                    raise
    if len(groups) > 1:
        await wait_routed(groups, topic)


# --------------------------------------------------------------------- send

async def bench_send(servers: list[str] | str, topic: str, size: int, inflight: int, batch: int,
                     duration_s: float, coalesce: bool = True,
                     admin_servers: list[str] | str | None = None, links: bool = True) -> SendBenchResult:
    """`admin_servers`: where the topic is made, when `servers` are front
    ends (which serve the messaging protocol only)."""
    if inflight < 1 or batch < 1 or duration_s <= 0:
        raise ValueError("need --inflight >= 1, --batch >= 1, --duration > 0")
    await ensure_topic(admin_servers or servers, topic)
    body = os.urandom(size) if size else b"."
    result = SendBenchResult(size, inflight, batch, coalesce)
    async with Producer(servers, [topic], coalesce=coalesce, links=links) as producer:
        await producer.send(Message(topic, body))  # warm: leader found, channel open
        start = time.perf_counter()
        stop_at = start + duration_s
        await asyncio.gather(*(_sender(producer, topic, body, batch, stop_at, result) for _ in range(inflight)))
        result.duration_s = time.perf_counter() - start
    return result


async def _sender(producer: Producer, topic: str, body: bytes, batch: int, stop_at: float,
                  result: SendBenchResult) -> None:
    clock = time.perf_counter
    while clock() < stop_at:
        sent = clock()
        try:
            if batch == 1:
                await producer.send(Message(topic, body))
            else:
                await producer.send_batch([Message(topic, body) for _ in range(batch)])
        except ClientError as error:
            _note_error(result.errors, error)
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        result.latencies_s.append(clock() - sent)
        result.messages += batch


def _note_error(errors: Counter[str], error: ClientError) -> None:
    if not errors:
        print(f"bench: {error}", file=sys.stderr, flush=True)
    errors[error.code_name] += 1


# ------------------------------------------------------------------ consume

async def prefill(servers: list[str] | str, topic: str, size: int, count: int) -> None:
    body = os.urandom(size) if size else b"."
    remaining = count
    async with Producer(servers, [topic]) as producer:
        async def sender() -> None:
            nonlocal remaining
            while remaining > 0:
                n = min(PREFILL_BATCH, remaining)
                remaining -= n
                await producer.send_batch([Message(topic, body) for _ in range(n)])
        await asyncio.gather(*(sender() for _ in range(PREFILL_INFLIGHT)))


async def bench_consume(servers: list[str] | str, topic: str, group: str | None, size: int, messages: int,
                        inflight: int, batch: int, duration_s: float,
                        on_start: Callable[[], None] = lambda: None, links: bool = True) -> ConsumeBenchResult:
    """`on_start` runs once the topic is filled, as the consumption starts
    (a caller measuring CPU leaves the filling out)."""
    if inflight < 1 or batch < 1 or messages < 1 or duration_s <= 0:
        raise ValueError("need --inflight >= 1, --batch >= 1, --messages >= 1, --duration > 0")
    await ensure_topic(servers, topic)
    group = group or f"BenchConsumeGroup-{uuid.uuid4().hex[:8]}"
    await prefill(servers, topic, size, messages)
    result = ConsumeBenchResult(size, inflight, batch)
    async with SimpleConsumer(servers, group, {topic: "*"}, links=links) as consumer:
        on_start()
        start = time.perf_counter()
        stop_at = start + duration_s
        reached = asyncio.Event()
        receivers = [asyncio.ensure_future(_receiver(consumer, batch, messages, stop_at, result, reached))
                     for _ in range(inflight)]
        everyone = asyncio.ensure_future(asyncio.gather(*receivers))
        target_reached = asyncio.ensure_future(reached.wait())
        await asyncio.wait([everyone, target_reached], return_when=asyncio.FIRST_COMPLETED)
        # Once N are acked, receives still long-polling would only add their
        # wait to the measured time: the clock stops at the last ack.
        result.duration_s = time.perf_counter() - start
        for task in (*receivers, target_reached):
            task.cancel()
        await asyncio.gather(everyone, target_reached, return_exceptions=True)
    return result


async def _receiver(consumer: SimpleConsumer, batch: int, target: int, stop_at: float,
                    result: ConsumeBenchResult, reached: asyncio.Event) -> None:
    clock = time.perf_counter
    while result.messages < target and clock() < stop_at:
        began = clock()
        try:
            received = await consumer.receive(batch, invisible_duration=60, await_duration_s=5)
        except ClientError as error:
            _note_error(result.errors, error)
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        result.receive_latencies_s.append(clock() - began)
        if not received:
            continue
        acking = clock()
        try:
            await consumer.ack(*received)
        except ClientError as error:
            _note_error(result.errors, error)
            continue
        result.ack_latencies_s.append(clock() - acking)
        result.messages += len(received)
        if result.messages >= target:
            reached.set()
