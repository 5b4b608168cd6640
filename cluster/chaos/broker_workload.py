"""The broker workload (`dledger chaos --workload broker`): producers and
consumers of the RocketMQ 5 API, every call and every delivery recorded in the
History for the broker checker (broker_checker.py).

Topics and groups (created through the AdminService before the load):

    ChaosNormal  normal    groups GA and GB (2 consumers each; 3 attempts)
    ChaosFifo    FIFO      group GF (FIFO, 1 consumer, 3 attempts), 4 message groups
    ChaosDelay   delayed   group GA (1 consumer); delays of 1-4 s
    ChaosTxn     txn       group GA (1 consumer); committed, rolled back, or
                           left undecided for the producer's check-back

A consumer subscribes to one topic: a receive serves one topic, and a
consumer of three would long-poll an empty one while the others wait.
    ChaosOfficial normal   the official client's producer and group GO

Producers (our client, one message per call so that every send is one
operation): each message carries a unique id (`bchaos:<uid>` in its body, the
uid also its key). FIFO messages are sent by one task per message group, each
send awaited before the next, so send order is queue order. Some normal
messages are never acked (each producer's first, then a share drawn; the
consumers nack them with a zero invisible duration: redelivered at once, then
dead-lettered after 3 attempts); some
have their invisible duration changed before the ack. In heavy mode (the
nemesis's crash-write) producers send batches of 32 back to back.

When the load stops, consumers drain: they go on until every group has
received (or seen the last attempt of) every message it is owed, or the drain
deadline passes.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any

from broker.client import (AckError, AdminClient, ClientError, Message, Producer, ReceivedMessage,
                           SimpleConsumer, TransactionResolution)
from cluster.chaos.broker_checker import BODY_PREFIX, GroupSpec, uid_of
from cluster.chaos.history import History, Operation, Outcome, SentMessage
from cluster.process_cluster import ROOT

log = logging.getLogger(__name__)

NORMAL, FIFO, DELAY, TXN, OFFICIAL = "ChaosNormal", "ChaosFifo", "ChaosDelay", "ChaosTxn", "ChaosOfficial"
TOPICS = {NORMAL: "normal", FIFO: "fifo", DELAY: "delay", TXN: "transaction", OFFICIAL: "normal"}
MAX_RETRIES = 2   # 3 attempts, then the dead-letter queue
GROUPS = (GroupSpec("GA", (NORMAL, DELAY, TXN), max_attempts=MAX_RETRIES + 1),
          GroupSpec("GB", (NORMAL,), max_attempts=MAX_RETRIES + 1),
          GroupSpec("GF", (FIFO,), fifo=True, max_attempts=MAX_RETRIES + 1),
          GroupSpec("GO", (OFFICIAL,), max_attempts=17))
OFFICIAL_GROUP = "GO"


@dataclass(frozen=True)
class BrokerWorkloadConfig:
    producers: int = 3
    # Sends per second per producer outside heavy bursts (FIFO tasks apart).
    rate_per_producer: float = 15.0
    message_groups: int = 4
    fifo_rate_per_group: float = 2.0
    consumers_per_group: int = 2
    official: bool = True
    official_rate: float = 5.0
    # Shares of a producer's sends.
    delay_share: float = 0.15
    txn_share: float = 0.15
    never_ack_share: float = 0.03
    change_share: float = 0.05
    body_size: int = 128
    heavy_batch: int = 32
    # One call's attempts together: longer than any single fault, so a call
    # rides a failover out (the client retries with the same message id).
    deadline_s: float = 12.0
    # One attempt: well above a commit, below a pause, so a client stuck on a
    # frozen leader gives up and finds the new one (as the log workload).
    request_timeout_s: float = 1.5
    invisible_s: float = 10.0
    transaction_recovery_s: float = 2.0
    drain_s: float = 40.0


class BrokerWorkload:
    name = "broker"
    groups = list(GROUPS)

    def __init__(self, servers: list[str], history: History, config: BrokerWorkloadConfig | None = None) -> None:
        self.servers = servers
        self.history = history
        self.config = config or BrokerWorkloadConfig()
        self.heavy = False
        self.rng = random.Random(0)
        self._count = 0
        self._stop_sending = asyncio.Event()
        self._checked: dict[str, str] = {}
        self.official_events = 0
        self.sends_ended_s: float | None = None
        # Calls our clients made, by path (messaging link or gRPC): the
        # summary shows the faults met the links too.
        self.call_paths: dict[str, int] = {"link": 0, "grpc": 0}

    # -------------------------------------------------------------- the run
    def set_heavy(self, heavy: bool) -> None:
        self.heavy = heavy

    def _client_options(self) -> dict[str, Any]:
        return {"deadline_s": self.config.deadline_s, "request_timeout_s": self.config.request_timeout_s}

    async def prepare(self) -> None:
        async with AdminClient(self.servers, deadline_s=30.0) as admin:
            for topic, kind in TOPICS.items():
                try:
                    await admin.create_topic(topic, 4, kind)
                except ClientError:
                    pass   # it exists (a repeated prepare)
            for group in GROUPS:
                try:
                    await admin.create_group(group.name, group.max_attempts - 1, group.fifo)
                except ClientError:
                    pass

    async def run(self, stop: asyncio.Event) -> None:
        await self.prepare()
        consumers_done = asyncio.Event()
        official = asyncio.ensure_future(self._official(consumers_done)) if self.config.official else None
        consumers = [asyncio.ensure_future(self._consumer(group, topic, i, consumers_done))
                     for group in GROUPS if group.name != OFFICIAL_GROUP for topic in group.topics
                     for i in range(self.config.consumers_per_group if topic == NORMAL else 1)]
        # A heartbeat a second: the producer's Telemetry stream (where
        # check-backs arrive) moves to a new leader within a second.
        async with Producer(self.servers, [TXN], checker=self._check_back,
                            transaction_recovery_s=self.config.transaction_recovery_s, coalesce=False,
                            heartbeat_interval_s=1.0, **self._client_options()) as producer:
            producers = [asyncio.ensure_future(self._producer(producer, f"p{i}", stop))
                         for i in range(self.config.producers)]
            producers += [asyncio.ensure_future(self._fifo_producer(producer, f"mg{i}", stop))
                          for i in range(self.config.message_groups)]
            await stop.wait()
            await asyncio.gather(*producers)
            self.sends_ended_s = self.history.now()
            self._stop_sending.set()
            await self._drain()
            consumers_done.set()
            await asyncio.gather(*consumers, return_exceptions=True)
            if official is not None:
                await official
            self._count_paths(producer)

    def _count_paths(self, client: Producer | SimpleConsumer) -> None:
        for path, calls in client.connection.links.calls_by_path.items():
            self.call_paths[path] += calls

    async def barrier(self, deadline_s: float = 30.0) -> int:
        """One acknowledged send after healing; 0 (the runner then waits for
        every node to commit what the leader has)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline_s
        async with Producer(self.servers, coalesce=False, **self._client_options()) as producer:
            while True:
                op = await self._send(producer, "final", NORMAL, "normal")
                if op.outcome is Outcome.OK:
                    return 0
                if loop.time() > give_up:
                    raise TimeoutError(f"no send acknowledged within {deadline_s}s after healing")
                await asyncio.sleep(0.2)

    # ------------------------------------------------------------ producers
    def _uid(self, client: str) -> str:
        self._count += 1
        return f"{client}-{self._count}"

    def _body(self, uid: str) -> bytes:
        body = BODY_PREFIX + uid.encode() + b" "
        return body + b"." * max(0, self.config.body_size - len(body))

    async def _producer(self, producer: Producer, name: str, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        rng = random.Random(zlib.crc32(name.encode()))
        # Each producer's first normal message is never acked (with a share
        # above 0): a short run on a slow machine sent 7 normal messages, none
        # of them drawn, and so had no dead letter to check.
        first_normal = self.config.never_ack_share > 0
        # Producer i's first send is of kind i % 3 (normal, delayed,
        # transactional): a 5 s run on a slow machine sent 7 messages, too
        # few for the draws to reach every kind.
        first_draw: float | None = (0.999, 0.0, self.config.delay_share)[int(name[1:]) % 3]
        while not stop.is_set():
            if self.heavy:
                await self._send_batch(producer, name)
                continue
            draw = rng.random()
            if first_draw is not None:
                draw, first_draw = first_draw, None
            if draw < self.config.delay_share:
                await self._send(producer, name, DELAY, "delay", delay_s=rng.uniform(1.0, 4.0))
            elif draw < self.config.delay_share + self.config.txn_share:
                intent = rng.choice(("commit", "commit", "rollback", "undecided"))
                await self._send_transaction(producer, name, intent)
            else:
                never_ack = rng.random() < self.config.never_ack_share or first_normal
                first_normal = False
                await self._send(producer, name, NORMAL, "normal", never_ack=never_ack)
            next_at = max(next_at + 1.0 / self.config.rate_per_producer, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def _fifo_producer(self, producer: Producer, message_group: str, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            await self._send(producer, message_group, FIFO, "fifo", message_group=message_group)
            next_at = max(next_at + 1.0 / self.config.fifo_rate_per_group, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def _record(self, uid: str, topic: str, kind: str, client: str, **fields: Any) -> Operation:
        # The barrier's send comes after the consumers stopped: nobody owes
        # it a delivery, so it is not a logical message of the run.
        if client != "final":
            self.history.sent[uid] = SentMessage(uid, topic, kind, client, **fields)
        return self.history.invoke(client, (uid,), kind="send")

    async def _send(self, producer: Producer, client: str, topic: str, kind: str, message_group: str = "",
                    delay_s: float = 0.0, never_ack: bool = False) -> Operation:
        uid = self._uid(client)
        due_ms = int((time.time() + delay_s) * 1000) if delay_s else 0
        op = self._record(uid, topic, kind, client, message_group=message_group, due_ms=due_ms,
                          never_ack=never_ack)
        message = Message(topic, self._body(uid), keys=[uid], message_group=message_group or None,
                          delivery_time=None)
        if delay_s:
            from datetime import datetime, timezone
            message = Message(topic, self._body(uid), keys=[uid],
                              delivery_time=datetime.fromtimestamp(due_ms / 1000, timezone.utc))
        try:
            await producer.send(message)
        except ClientError as error:
            self._failed(op, error)
        else:
            self.history.ok(op, 0)
        return op

    async def _send_batch(self, producer: Producer, client: str) -> None:
        uids = [self._uid(client) for _ in range(self.config.heavy_batch)]
        for uid in uids:
            self.history.sent[uid] = SentMessage(uid, NORMAL, "normal", client)
        op = self.history.invoke(client, tuple(uids), kind="send")
        try:
            await producer.send_batch([Message(NORMAL, self._body(uid), keys=[uid]) for uid in uids])
        except ClientError as error:
            self._failed(op, error)
        else:
            self.history.ok(op, 0)

    def _failed(self, op: Operation, error: ClientError) -> None:
        # Past the deadline the send may or may not be stored: unknown. An
        # answer that it was refused (a bad request) would be a fail; the
        # workload sends none.
        text = f"{error.code_name}: {error.message}"
        if error.retriable:
            self.history.unknown(op, text)
        else:
            self.history.fail(op, text)

    async def _send_transaction(self, producer: Producer, client: str, intent: str) -> None:
        uid = self._uid(client)
        op = self._record(uid, TXN, "txn", client, intent=intent)
        transaction = producer.begin_transaction()
        try:
            await transaction.send(Message(TXN, self._body(uid), keys=[uid]))
        except ClientError as error:
            self._failed(op, error)
            return
        self.history.ok(op, 0)
        if intent == "undecided":
            return
        end = self.history.invoke(client, (uid,), kind="end")
        try:
            await (transaction.commit() if intent == "commit" else transaction.rollback())
        except ClientError as error:
            self._failed(end, error)
        else:
            self.history.ok(end, 0)

    def _check_back(self, message: ReceivedMessage) -> TransactionResolution:
        uid = uid_of(message.body) or ""
        sent = self.history.sent.get(uid)
        if sent is None:
            return TransactionResolution.UNKNOWN
        intent = sent.intent
        if intent == "undecided":
            intent = self._checked.get(uid) or ("commit" if zlib.crc32(uid.encode()) % 2 else "rollback")
        self._checked[uid] = intent
        from cluster.chaos.history import CheckBack
        self.history.checks.append(CheckBack(self.history.now(), uid, intent))
        return TransactionResolution.COMMIT if intent == "commit" else TransactionResolution.ROLLBACK

    # ------------------------------------------------------------ consumers
    async def _consumer(self, group: GroupSpec, topic: str, number: int, done: asyncio.Event) -> None:
        name = f"{group.name}-{topic}-c{number}"
        async with SimpleConsumer(self.servers, group.name, [topic], await_duration_s=5.0,
                                  **self._client_options()) as consumer:
            try:
                while not done.is_set():
                    op = self.history.invoke(name, ("",), kind="receive", group=group.name)
                    try:
                        messages = await consumer.receive(16, self.config.invisible_s)
                    except ClientError as error:
                        self.history.unknown(op, f"{error.code_name}: {error.message}")
                        await asyncio.sleep(0.05)
                        continue
                    self.history.ok(op, 0)
                    await self._handle(consumer, group, name, op, messages)
            finally:
                self._count_paths(consumer)

    async def _handle(self, consumer: SimpleConsumer, group: GroupSpec, name: str, receive: Operation,
                      messages: list[ReceivedMessage]) -> None:
        to_ack: list[tuple[str, ReceivedMessage]] = []
        for message in messages:
            uid = uid_of(message.body)
            if uid is None:
                continue
            self.history.delivered(group.name, name, uid, message.message_id, message.delivery_attempt,
                                   receive.invoke_s)
            sent = self.history.sent.get(uid)
            if sent is not None and sent.never_ack:
                try:
                    await consumer.change_invisible_duration(message, 0)
                except ClientError:
                    pass   # the lease runs out instead
                continue
            if zlib.crc32(f"{group.name}/{uid}".encode()) % 100 < self.config.change_share * 100:
                try:
                    await consumer.change_invisible_duration(message, 12)
                except ClientError:
                    pass   # the ack below then answers superseded or expired: recorded
            to_ack.append((uid, message))
        if to_ack:
            await self._ack(consumer, group, name, to_ack)

    async def _ack(self, consumer: SimpleConsumer, group: GroupSpec, name: str,
                   items: list[tuple[str, ReceivedMessage]]) -> None:
        ops = [(self.history.invoke(name, (uid,), kind="ack", group=group.name), message)
               for uid, message in items]
        try:
            await consumer.ack(*(m for _, m in items))
        except AckError as error:
            for op, message in ops:
                failure = error.failures.get(message.message_id)
                if failure is None:
                    self.history.ok(op, 0)
                elif failure.retriable:
                    self.history.unknown(op, f"{failure.code_name}: {failure.message}")
                else:
                    self.history.fail(op, f"{failure.code_name}: {failure.message}")
        except ClientError as error:
            for op, _ in ops:
                self.history.unknown(op, f"{error.code_name}: {error.message}")
        else:
            for op, _ in ops:
                self.history.ok(op, 0)

    # ---------------------------------------------------------------- drain
    def owed(self) -> dict[str, int]:
        """Per group, how many messages it is still owed: acknowledged sends
        of its topics it has not received (a never-acked one: not at its last
        attempt), transactions committed or not yet decided included."""
        delivered: dict[tuple[str, str], int] = {}
        for d in self.history.deliveries:
            key = (d.group, d.uid)
            delivered[key] = max(delivered.get(key, 0), d.attempt)
        acked = {uid for op in self.history.operations if op.kind == "send" and op.outcome is Outcome.OK
                 for uid in op.ids}
        rolled_back = {uid for uid, answer in self._checked.items() if answer == "rollback"}
        rolled_back |= {uid for op in self.history.operations if op.kind == "end" and op.outcome is Outcome.OK
                        for uid in op.ids if self.history.sent[uid].intent == "rollback"}
        owed: dict[str, int] = {}
        for group in GROUPS:
            count = 0
            for uid in acked:
                sent = self.history.sent.get(uid)
                if sent is None or sent.topic not in group.topics or uid in rolled_back:
                    continue
                attempt = delivered.get((group.name, uid), 0)
                if attempt == 0 or (sent.never_ack and attempt < group.max_attempts):
                    count += 1
            owed[group.name] = count
        return owed

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.config.drain_s
        while loop.time() < give_up:
            owed = self.owed()
            if not any(owed.values()):
                return
            await asyncio.sleep(0.25)
        log.warning("drain deadline passed; still owed: %s", self.owed())

    # ------------------------------------------------------- official client
    async def _official(self, done: asyncio.Event) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster.chaos.official_client", "--servers", ";".join(self.servers),
            "--topic", OFFICIAL, "--group", OFFICIAL_GROUP, "--rate", str(self.config.official_rate),
            "--prefix", "official", cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdin is not None and process.stdout is not None
        reader = asyncio.ensure_future(self._read_official(process.stdout))
        await self._stop_sending.wait()
        process.stdin.write(b"stop\n")
        await process.stdin.drain()
        await done.wait()
        process.stdin.write(b"finish\n")
        await process.stdin.drain()
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 40)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        await reader

    async def _read_official(self, stdout: asyncio.StreamReader) -> None:
        sends: dict[str, Operation] = {}
        started = self.history.started_at
        async for line in stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.official_events += 1
            kind = event["type"]
            at = event.get("time", 0.0) - started
            if kind == "send":
                uid = event["uid"]
                self.history.sent[uid] = SentMessage(uid, OFFICIAL, "normal", "official")
                op = self.history.invoke("official", (uid,), kind="send")
                op.invoke_s = at
                sends[uid] = op
            elif kind in ("send-ok", "send-fail"):
                op = sends[event["uid"]]
                (self.history.ok(op, 0) if kind == "send-ok" else self.history.fail(op, event.get("error", "")))
                op.complete_s = at
            elif kind == "receive-ok" or kind == "receive-fail":
                op = self.history.invoke("official-consumer", ("",), kind="receive", group=OFFICIAL_GROUP)
                (self.history.ok(op, 0) if kind == "receive-ok" else self.history.unknown(op, event["error"]))
                op.invoke_s, op.complete_s = event["invoked"] - started, at
            elif kind == "delivery":
                delivery = self.history.delivered(OFFICIAL_GROUP, "official-consumer", event["uid"],
                                                  event["message_id"], event["attempt"],
                                                  event["invoked"] - started)
                delivery.time_s, delivery.wall_ms = at, event["wall_ms"]
            elif kind in ("ack-ok", "ack-fail"):
                op = self.history.invoke("official-consumer", (event["uid"],), kind="ack", group=OFFICIAL_GROUP)
                (self.history.ok(op, 0) if kind == "ack-ok" else self.history.unknown(op, event["error"]))
                op.invoke_s, op.complete_s = event["invoked"] - started, at
