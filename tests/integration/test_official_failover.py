"""The official RocketMQ 5 Python client across leader SIGKILLs: its Producer
sends one message at a time (it makes three quick attempts and then gives
up) while the leader is killed five times; the nodes hold each call through
the election and complete it through the new leader, so no send fails, and
every acknowledged send reaches its SimpleConsumer (bench/broker_failover.py
is the harness; it prints the same figures)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.broker_failover import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_official_client_sends_survive_five_leader_sigkills(tmp_path: Path):
    summary = await run(5, tmp_path)
    print(f"\n{summary}")
    assert summary["rounds"] == 5 and summary["acked_sends"] > 100
    assert summary["failed_sends"] == 0, summary["send_errors"]
    assert summary["undelivered"] == 0
    assert summary["next_send_ms"]["missing"] == 0 and summary["next_delivery_ms"]["missing"] == 0
