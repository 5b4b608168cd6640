"""The producer's SendAccumulator, driven through an in-memory send call: sends
made in one event-loop turn or waiting for a free call share calls, one topic per call, a message group never has two
calls in flight and leaves in send order, and a failed call fails only its own
sends."""
from __future__ import annotations

import asyncio

from broker.client.accumulator import BatchOrder, PendingSend, SendAccumulator
from broker.client.errors import ClientError, UnavailableError
from broker.client.message import SendReceipt
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb


class InMemoryBroker:
    """Stores what each call carries; answers when the test releases it."""

    def __init__(self, fail_topic: str | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.in_flight: list[set[str]] = []
        self.max_concurrent = 0
        self.gate = asyncio.Event()
        self.fail_topic = fail_topic
        self.group_overlaps = 0

    async def send(self, topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        groups = {m.system_properties.message_group for m in messages if m.system_properties.HasField("message_group")}
        if any(groups & other for other in self.in_flight):
            self.group_overlaps += 1
        self.in_flight.append(groups)
        self.max_concurrent = max(self.max_concurrent, len(self.in_flight))
        self.calls.append((topic, [m.body.decode() for m in messages]))
        await self.gate.wait()
        self.in_flight.remove(groups)
        if topic == self.fail_topic:
            return [UnavailableError(pb.HA_NOT_AVAILABLE, "no leader")] * len(messages)
        return [SendReceipt(m.system_properties.message_id, topic, 0, i) for i, m in enumerate(messages)]


def pending(topic: str, body: str, group: str | None = None) -> PendingSend:
    message = pb.Message(topic=pb.Resource(name=topic), body=body.encode(),
                         system_properties=pb.SystemProperties(message_id=body))
    if group is not None:
        message.system_properties.message_group = group
    return PendingSend(topic, message, len(body), group, asyncio.get_running_loop().create_future())


async def release(broker: InMemoryBroker, accumulator: SendAccumulator) -> None:
    broker.gate.set()
    await accumulator.flush()


async def test_sends_of_one_turn_leave_together_spread_over_the_free_calls():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=2, max_messages=1000, max_bytes=1 << 20)
    sends = [pending("T", f"m{i}") for i in range(100)]
    for send in sends:
        accumulator.add([send])  # one at a time, as concurrent send() calls arrive
    assert broker.calls == []    # they linger until the turn ends
    await asyncio.sleep(0)
    await release(broker, accumulator)
    assert broker.max_concurrent <= 2
    # Two calls, none under min_call_messages (64): the broker works on one
    # while the other is replicated.
    assert [len(bodies) for _, bodies in broker.calls] == [64, 36]
    assert [body for _, bodies in broker.calls for body in bodies] == [f"m{i}" for i in range(100)]
    assert all(s.future.result().message_id == f"m{i}" for i, s in enumerate(sends))


async def test_sends_waiting_for_a_free_call_leave_together_when_one_comes_back():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=1, max_messages=1000, max_bytes=1 << 20)
    accumulator.add([pending("T", "first")])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    for i in range(10):
        accumulator.add([pending("T", f"m{i}")])
    await release(broker, accumulator)
    assert broker.calls == [("T", ["first"]), ("T", [f"m{i}" for i in range(10)])]


async def test_a_full_batch_leaves_without_waiting_for_the_turn_to_end():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=2, max_messages=4, max_bytes=1 << 20)
    for i in range(4):
        accumulator.add([pending("T", f"m{i}")])
    assert broker.calls == [] or len(broker.calls[0][1]) == 4
    await asyncio.sleep(0)   # the call's task runs: no linger was needed
    assert broker.calls == [("T", ["m0", "m1", "m2", "m3"])]
    await release(broker, accumulator)


async def test_a_call_carries_one_topic_and_respects_the_batch_limits():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=1, max_messages=3, max_bytes=1 << 20)
    accumulator.add([pending("A", "a0"), pending("B", "b0"), pending("A", "a1"), pending("A", "a2"),
                     pending("A", "a3"), pending("B", "b1")])
    await release(broker, accumulator)
    assert broker.calls == [("A", ["a0", "a1", "a2"]), ("B", ["b0", "b1"]), ("A", ["a3"])]


async def test_a_message_group_never_has_two_calls_in_flight_and_keeps_its_order():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=4, max_messages=2, max_bytes=1 << 20)
    sends = [pending("F", f"{g}:{i}", group=g) for i in range(5) for g in ("g1", "g2", "g3")]
    for send in sends:
        accumulator.add([send])
    for _ in range(20):
        await asyncio.sleep(0)
        broker.gate.set()
        await asyncio.sleep(0)
        broker.gate.clear()
    await release(broker, accumulator)
    assert broker.group_overlaps == 0
    for group in ("g1", "g2", "g3"):
        order = [body for _, bodies in broker.calls for body in bodies if body.startswith(group)]
        assert order == [f"{group}:{i}" for i in range(5)]


async def test_a_failed_call_fails_only_its_own_sends():
    broker = InMemoryBroker(fail_topic="Down")
    accumulator = SendAccumulator(broker.send, max_inflight=4, max_messages=100, max_bytes=1 << 20)
    down, up = pending("Down", "d"), pending("Up", "u")
    accumulator.add([down, up])
    await release(broker, accumulator)
    assert isinstance(down.future.exception(), UnavailableError)
    assert up.future.result().topic == "Up"


async def test_a_batch_leaves_in_order_one_full_call_after_another():
    # Spread over parallel calls, a batch's later part could be stored first.
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=4, max_messages=100, max_bytes=1 << 20)
    order = BatchOrder()
    sends = [PendingSend("T", pending("T", f"m{i}").message, 2, order, asyncio.get_running_loop().create_future())
             for i in range(300)]
    accumulator.add(sends)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(broker.in_flight) == 1          # not side by side
    await release(broker, accumulator)
    assert [len(bodies) for _, bodies in broker.calls] == [100, 100, 100]
    assert [body for _, bodies in broker.calls for body in bodies] == [f"m{i}" for i in range(300)]


async def test_concurrent_batches_still_spread_over_the_free_calls():
    broker = InMemoryBroker()
    accumulator = SendAccumulator(broker.send, max_inflight=4, max_messages=1000, max_bytes=1 << 20)
    loop = asyncio.get_running_loop()
    for b in range(16):   # 16 senders of 64-message batches, in one turn
        order = BatchOrder()
        accumulator.add([PendingSend("T", pending("T", f"b{b}m{i}").message, 2, order, loop.create_future())
                         for i in range(64)])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(broker.in_flight) == 4
    await release(broker, accumulator)
    assert [len(bodies) for _, bodies in broker.calls] == [256, 256, 256, 256]


async def test_prepared_messages_are_split_at_the_producers_call_limits_and_answered_in_order():
    """Producer.send_prepared (a bulk writer's path, without the accumulator):
    calls of at most max_batch_messages and max_batch_bytes, sent together,
    each message's outcome in the order given; a call that fails outright
    (its route lookup) fails only its own messages."""
    from broker.client.producer import Producer

    broker = InMemoryBroker()
    broker.gate.set()
    producer = Producer("127.0.0.1:1", max_batch_messages=3, max_batch_bytes=10)

    async def send_call(topic: str, messages: list[pb.Message]) -> list[SendReceipt | ClientError]:
        if b"boom" in [m.body for m in messages]:
            raise UnavailableError(pb.HA_NOT_AVAILABLE, "no route")
        return await broker.send(topic, messages)

    producer.send_call = send_call  # type: ignore[method-assign]
    bodies = ["a", "b", "c", "d", "eeeeeeee", "f", "g", "boom", "h"]
    outcomes = await producer.send_prepared("T", [pending("T", b).message for b in bodies])
    # 3 messages a call at most; 10 bytes a call at most (d + eeeeeeee + f is 10, g would be 11).
    assert [c[1] for c in broker.calls] == [["a", "b", "c"], ["d", "eeeeeeee", "f"]]
    assert [o.message_id if isinstance(o, SendReceipt) else "failed" for o in outcomes] == \
        ["a", "b", "c", "d", "eeeeeeee", "f", "failed", "failed", "failed"]
