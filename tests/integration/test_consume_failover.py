"""Consumption through a leader failover: producers and consumers keep going
while the leader is SIGKILLed. Every message whose send was acknowledged is
delivered, and in the end the broker holds every one consumed (nothing left
in flight); a message whose ack was answered OK is never delivered again.
Consumers retry a failed ack on another node with the same receipt handle
(the new leader honours it). Printed: messages a consumer saw more than once,
messages first seen at a second attempt (a receive answer lost in the kill:
delivered again when its lease ran out), ack entries given up."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import grpc
import pytest

from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc
from tests.integration.consume_helpers import METADATA, message, receive_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
PHASE_S = 50   # each phase's limit: a failure says where it stuck well before the test timeout
TOPIC, GROUP = "Failover", "FailoverGroup"
MESSAGES, SEND_BATCH, CONSUMERS = 2000, 20, 4
KILL_AFTER_ACKED = 600


Copy = tuple[int, int]   # a stored message: (queue id, queue offset)


def copy_of(message: pb.Message) -> Copy:
    return message.system_properties.queue_id, message.system_properties.queue_offset


class Ledger:
    """What the clients saw. Deliveries and acks are counted per stored copy:
    a send retried across the kill may have stored a batch twice (the same
    message ids at other offsets), which is the producer's duplicate, not a
    redelivery."""

    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.delivered: set[str] = set()          # message ids
        self.deliveries: Counter[Copy] = Counter()
        self.acked_at: dict[Copy, float] = {}     # when its ack was answered OK
        self.redelivered_after_ack: list[Copy] = []
        self.failed_calls = 0
        self.unanswered_acks = 0                  # ack entries given up after retries
        self.lost_receives = 0                    # copies first seen at attempt 2+


async def producer(stubs: list[service_pb2_grpc.MessagingServiceStub], ledger: Ledger) -> None:
    turn = 0
    while len(ledger.sent) < MESSAGES:
        batch = [message(TOPIC, b"%d" % i) for i in range(SEND_BATCH)]
        stub = stubs[turn % len(stubs)]
        while True:   # a retry keeps the message ids: the broker answers a repeat with the original receipt
            try:
                answer = await stub.SendMessage(spb.SendMessageRequest(messages=batch), metadata=METADATA, timeout=5)
                if answer.status.code == pb.OK:
                    ledger.sent.update(e.message_id for e in answer.entries)
                    break
            except grpc.aio.AioRpcError:
                pass
            ledger.failed_calls += 1
            turn += 1
            stub = stubs[turn % len(stubs)]
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.005)


RETRIABLE = (pb.HA_NOT_AVAILABLE, pb.SLAVE_PERSISTENCE_TIMEOUT, pb.PROXY_TIMEOUT, pb.INTERNAL_SERVER_ERROR)


async def consumer(index: int, stubs: list[service_pb2_grpc.MessagingServiceStub], ledger: Ledger,
                   done: asyncio.Event) -> None:
    turn = index
    while not done.is_set():
        stub = stubs[turn % len(stubs)]
        try:
            request = receive_request(GROUP, TOPIC, batch=16, invisible=10, polling=5, queue=index)
            got = [r.message async for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=12)
                   if r.HasField("message")]
        except grpc.aio.AioRpcError:
            ledger.failed_calls += 1
            turn += 1              # that node is gone: the next one forwards to the new leader
            await asyncio.sleep(0.1)
            continue
        for m in got:
            copy = copy_of(m)
            if copy not in ledger.deliveries and m.system_properties.delivery_attempt > 1:
                ledger.lost_receives += 1          # an earlier delivery's answer never arrived
            ledger.deliveries[copy] += 1
            ledger.delivered.add(m.system_properties.message_id)
            if copy in ledger.acked_at:
                ledger.redelivered_after_ack.append(copy)
        turn = await acknowledge(got, stubs, turn, ledger, done)


async def acknowledge(messages: list[pb.Message], stubs: list[service_pb2_grpc.MessagingServiceStub], turn: int,
                      ledger: Ledger, done: asyncio.Event) -> int:
    """Ack, retrying what failed for want of a leader on the next node, as
    the official clients do (a receipt handle survives the failover); returns
    the node to use next."""
    pending = {m.system_properties.receipt_handle: m for m in messages}
    for _ in range(10):
        if not pending or done.is_set():
            break
        try:
            answer = await stubs[turn % len(stubs)].AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
                entries=[spb.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=h)
                         for h, m in pending.items()]),
                metadata=METADATA, timeout=5)
        except grpc.aio.AioRpcError:
            answer = None
        if answer is not None:
            now = time.monotonic()
            for entry in answer.entries:
                if entry.status.code == pb.OK:
                    ledger.acked_at.setdefault(copy_of(pending[entry.receipt_handle]), now)
                if entry.status.code not in RETRIABLE:
                    pending.pop(entry.receipt_handle, None)   # done, or refused for good (e.g. expired)
            if not pending:
                return turn
        ledger.failed_calls += 1
        turn += 1
        await asyncio.sleep(0.2)
    ledger.unanswered_acks += len(pending)
    return turn


async def consumed(stubs: list[service_pb2_grpc.MessagingServiceStub]) -> int:
    """The group's consumed offsets summed over the topic's queues (-1 when
    no node answers)."""
    return await summed(stubs, lambda stub, queue: stub.GetOffset(spb.GetOffsetRequest(
        group=pb.Resource(name=GROUP), message_queue=queue), metadata=METADATA, timeout=2))


async def stored(stubs: list[service_pb2_grpc.MessagingServiceStub]) -> int:
    """Messages the topic holds: its queues' end offsets summed (a send
    retried across the failover may have stored a batch twice)."""
    return await summed(stubs, lambda stub, queue: stub.QueryOffset(spb.QueryOffsetRequest(
        message_queue=queue, query_offset_policy=pb.END), metadata=METADATA, timeout=2))


async def summed(stubs: list[service_pb2_grpc.MessagingServiceStub], call) -> int:  # noqa: ANN001
    for stub in stubs:
        try:
            total = 0
            for queue_id in range(8):
                answer = await call(stub, pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id))
                if answer.status.code != pb.OK:
                    raise LookupError(answer.status.message)
                total += answer.offset
            return total
        except (grpc.aio.AioRpcError, LookupError):
            continue
    return -1


def log_tails(cluster: ProcessCluster, lines: int = 15) -> str:
    tails = []
    for node in cluster.ids:
        text = (cluster.base / f"{node}.log").read_text(errors="replace").splitlines()
        tails.append(f"--- {node}\n" + "\n".join(text[-lines:]))
    return "\n".join(tails)


async def test_consumers_lose_no_message_and_get_no_acked_message_again_across_a_leader_kill(tmp_path):
    cluster = ProcessCluster(tmp_path)
    cluster.start()
    channels: list[grpc.aio.Channel] = []
    try:
        addresses = list(cluster.addresses.values())
        client = DLedgerClient(addresses)
        leader = await find_leader(client, addresses)
        await client.close()
        channels = [grpc.aio.insecure_channel(a) for a in addresses]
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        ledger, done = Ledger(), asyncio.Event()
        sending = asyncio.ensure_future(producer(stubs, ledger))
        while not ledger.sent:
            await asyncio.sleep(0.05)
        consuming = [asyncio.ensure_future(consumer(i, stubs, ledger, done)) for i in range(CONSUMERS)]
        deadline = time.monotonic() + PHASE_S
        while len(ledger.acked_at) < KILL_AFTER_ACKED:
            await asyncio.sleep(0.02)
            assert not sending.done() or sending.exception() is None
            assert time.monotonic() < deadline, f"consumers stuck before the kill: {len(ledger.acked_at)} acked, " \
                                                f"{len(ledger.sent)} sent, {ledger.failed_calls} failed calls\n" \
                                                f"{log_tails(cluster)}"
        killed_at = time.monotonic()
        cluster.kill(leader)
        live = [stub for node, stub in zip(cluster.addresses, stubs) if node != leader]
        try:
            await asyncio.wait_for(asyncio.shield(sending), PHASE_S)
        except asyncio.TimeoutError:
            raise AssertionError(f"producers stuck after the kill: {len(ledger.sent)} sent, "
                                 f"{ledger.failed_calls} failed calls\n{log_tails(cluster)}") from None
        # Every message delivered, and none left in flight at the broker (an
        # ack whose answer was lost either took effect or its lease runs out
        # and the message comes again).
        deadline = time.monotonic() + PHASE_S
        while time.monotonic() < deadline and not (ledger.sent <= ledger.delivered and
                                                   await consumed(live) >= await stored(live) > 0):
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.wait_for(asyncio.gather(*consuming), 20)
        lost = ledger.sent - ledger.delivered
        duplicates = {m: n for m, n in ledger.deliveries.items() if n > 1}
        report = {"sent": len(ledger.sent), "acked": len(ledger.acked_at), "deliveries": sum(ledger.deliveries.values()),
                  "delivered_more_than_once": len(duplicates), "extra_deliveries": sum(n - 1 for n in duplicates.values()),
                  "redelivered_after_ok_ack": len(ledger.redelivered_after_ack), "failed_calls": ledger.failed_calls,
                  "acks_unanswered": ledger.unanswered_acks, "first_seen_redelivered": ledger.lost_receives,
                  "stored": await stored(live), "consumed_at_broker": await consumed(live),
                  "all_acked_s_after_kill": round(max(ledger.acked_at.values()) - killed_at, 2)}
        print("FAILOVER", json.dumps(report))
        assert not lost, f"{len(lost)} acknowledged messages never delivered: {sorted(lost)[:5]}\n{log_tails(cluster)}"
        assert report["consumed_at_broker"] == report["stored"] >= len(ledger.sent), f"{report}\n{log_tails(cluster)}"
        assert ledger.redelivered_after_ack == [], report
        assert report["failed_calls"] > 0, "the kill went unnoticed: the test proved nothing"
    finally:
        for channel in channels:
            await channel.close()
        cluster.stop_all()

