"""Nodes on uvloop (`dledger node --event-loop uvloop`, cluster/event_loop.py):
three node processes with front ends say in their start-up line that they run
on uvloop, and the broker works through them as on asyncio's loop: two
rounds of 150 concurrent sends with the leader SIGKILLed between them (and
restarted after), no send failing, and every message received and
acknowledged once by a consumer."""
from __future__ import annotations

import asyncio
import re
import time

import pytest

from broker.client import AdminClient, Message, Producer, SimpleConsumer
from cluster.process_cluster import ProcessCluster
from tests.integration.broker_cluster import SPARSE_FILES, leader_of, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC, GROUP = "OnUvloop", "OnUvloopGroup"
PER_ROUND = 150


async def send_round(address: str, prefix: str) -> set[str]:
    bodies = [f"{prefix}-{i}" for i in range(PER_ROUND)]
    async with Producer(address, [TOPIC]) as producer:
        await asyncio.gather(*(producer.send(Message(TOPIC, body.encode(), keys=[body])) for body in bodies))
    return set(bodies)


async def test_a_cluster_on_uvloop_survives_a_leader_kill_and_delivers_everything(tmp_path):
    cluster = ProcessCluster(tmp_path / "uv", extra_args=[*SPARSE_FILES, "--event-loop", "uvloop"],
                             front_ends=True)
    cluster.start()
    try:
        address = servers(cluster)
        async with AdminClient(address, deadline_s=30) as admin:
            await admin.create_topic(TOPIC, 4)
            await admin.create_group(GROUP)
        for node in cluster.ids:
            # A node serves (its front end is open) a moment before it logs
            # that it has started: wait for the line.
            deadline = time.monotonic() + 10
            while not re.search(r"node started: .* loop=uvloop ",
                                started := (cluster.log_dir / f"{node}.log").read_text()) \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert re.search(r"node started: .* loop=uvloop ", started), started[-2000:]
        sent = await send_round(address, "before")
        killed = await leader_of(cluster)
        cluster.kill(killed)
        sent |= await send_round(address, "after")          # through the election, no failure
        cluster.start(killed)
        received: dict[str, int] = {}
        async with SimpleConsumer(address, GROUP, {TOPIC: "*"}) as consumer:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while set(received) < sent and loop.time() < deadline:
                messages = await consumer.receive(32, invisible_duration=30, await_duration_s=2)
                for message in messages:
                    body = message.body.decode()
                    received[body] = received.get(body, 0) + 1
                if messages:
                    await consumer.ack(*messages)
        assert set(received) == sent
        assert max(received.values()) == 1
    finally:
        cluster.stop_all()
