"""The official RocketMQ 5 Python client across leader SIGKILLs: its Producer
sends one message at a time (it makes three quick attempts and then gives
up) and its SimpleConsumer receives (it does not retry a receive at all)
while the leader is killed five times. Routes point the client at the
nodes' front ends, which the leader closes while it leads, so the kills cut
none of its connections: the front ends hold each call through the election
and complete it through the new leader. No send, receive or ack fails, and
every acknowledged send reaches the consumer (bench/broker_failover.py is
the harness; it prints the same figures)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.broker_failover import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_official_client_sees_no_failed_call_across_five_leader_sigkills(tmp_path: Path):
    summary = await run(5, tmp_path)
    print(f"\n{summary}")
    assert summary["rounds"] == 5 and summary["acked_sends"] > 100
    assert summary["failed_sends"] == 0, summary["send_errors"]
    assert summary["failed_receives"] == 0, summary["receive_errors"]
    assert summary["failed_acks"] == 0, summary["ack_errors"]
    assert summary["undelivered"] == 0, summary["undelivered_ids"]
    assert summary["next_send_ms"]["missing"] == 0 and summary["next_delivery_ms"]["missing"] == 0
