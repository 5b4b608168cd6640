"""A node's clean stop (SIGTERM) with its streams open: three node processes
with front ends, after sends and a receive through the followers' front ends
(so a follower relays to the leader), the leader's PeerStream open on each
follower, and a producer still connected (its Telemetry stream relayed by a
follower's front end). One follower stops alone, the producer sends on, then
the rest stop. Every node stops in well under its shutdown grace (2 s): the
streams end once what they carry is answered (dledger/rpc/stream_server.py
OpenStreams, Telemetry relays and sessions); before, each of these stops
took the whole grace."""
from __future__ import annotations

import asyncio
import re
import signal
from datetime import datetime
from pathlib import Path

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.message import Message
from broker.client.producer import Producer
from cluster.node import SHUTDOWN_GRACE_S
from cluster.process_cluster import ProcessCluster, find_leader, wait_serving
from dledger.client import DLedgerClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*dledger\.node: node (stopping|stopped)$")


def stop_seconds(log: Path) -> float:
    """From the node's "node stopping" line to its "node stopped"."""
    times = {}
    for line in log.read_text().splitlines():
        if match := STAMP.match(line):
            times[match.group(2)] = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    assert set(times) == {"stopping", "stopped"}, f"{log.name} did not stop cleanly"
    return (times["stopped"] - times["stopping"]).total_seconds()


async def started(tmp_path: Path) -> tuple[ProcessCluster, str]:
    """Three node processes with front ends, and the id of their leader."""
    cluster = ProcessCluster(tmp_path / "nodes", front_ends=True)
    cluster.start()
    addresses = list(cluster.addresses.values())
    try:
        async with DLedgerClient(addresses) as admin:
            leader = await find_leader(admin, addresses, timeout=30.0)
            # Every node up: a node still importing when the test stops it
            # dies of the SIGTERM before it logs anything (seen on a slow day).
            await wait_serving(admin, addresses, timeout=30.0)
            return cluster, leader
    except BaseException:
        cluster.stop_all()
        raise


async def test_nodes_stop_without_waiting_out_the_grace_for_open_streams(tmp_path: Path):
    cluster, leader = await started(tmp_path)
    try:
        front_ends = list(cluster.front_ends.values())
        async with Producer(front_ends) as producer:
            for i in range(10):
                await producer.send(Message("StopTopic", b"m%d" % i))
            async with SimpleConsumer(front_ends, "stop-group", ["StopTopic"], await_duration_s=1.0) as consumer:
                assert await consumer.receive(16, 30.0)
            follower = cluster.procs[next(n for n in cluster.ids if n != leader)]
            follower.send_signal(signal.SIGTERM)
            await asyncio.to_thread(follower.wait, 30)
            await producer.send(Message("StopTopic", b"after a follower stopped"))
            cluster.stop_all()   # the producer still connected
    finally:
        cluster.stop_all()
    took = {node: stop_seconds(cluster.log_dir / f"{node}.log") for node in cluster.ids}
    assert all(seconds < SHUTDOWN_GRACE_S * 0.6 for seconds in took.values()), took


async def test_a_leader_stopped_cleanly_under_sends_fails_none_and_stops_at_once(tmp_path: Path):
    """A rolling restart's step: the leader gets SIGTERM while 16 senders
    send through the front ends. Its streams end once their calls are
    answered, calls it had not read fail over (never run twice: the client
    retries with the same message id), and no send fails."""
    cluster, leader = await started(tmp_path)
    try:
        sent: list[bytes] = []
        stop = asyncio.Event()
        async with Producer(list(cluster.front_ends.values())) as producer:
            async def sender(k: int) -> None:
                i = 0
                while not stop.is_set() and i < 5_000:
                    body = b"%d-%d" % (k, i)
                    await producer.send(Message("RollingTopic", body))   # a failure fails the test
                    sent.append(body)
                    i += 1

            senders = [asyncio.ensure_future(sender(k)) for k in range(16)]
            await asyncio.sleep(1.5)
            before = len(sent)
            old = cluster.procs.pop(leader)
            old.send_signal(signal.SIGTERM)
            await asyncio.to_thread(old.wait, 30)
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.gather(*senders)
        assert before > 0 and len(sent) > before
        assert stop_seconds(cluster.log_dir / f"{leader}.log") < SHUTDOWN_GRACE_S * 0.6
    finally:
        cluster.stop_all()
