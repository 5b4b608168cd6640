"""The event loop stays responsive: its stalls are measured (the
dledger_event_loop_lag_seconds gauge), and a peer that stays unreachable
does not leave a gRPC channel behind every few seconds."""
from __future__ import annotations

import asyncio
import gc
import time

import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.loop_lag import LoopLagMonitor
from dledger.rpc import peer_client
from dledger.rpc.peer_client import GrpcTransport
from dledger.transport import TransportError
from rpcgen import dledger_pb2 as pb

pytestmark = pytest.mark.timeout(30)


async def test_the_lag_monitor_sees_a_stall_and_forgets_it_after_its_window():
    monitor = LoopLagMonitor(window_s=1)
    task = asyncio.get_running_loop().create_task(monitor.run())
    await asyncio.sleep(0.05)
    time.sleep(0.12)                  # a callback holding the loop
    await asyncio.sleep(0.05)
    assert 0.09 < monitor.lag_s < 0.5 and monitor.stalls == 1
    await asyncio.sleep(2.1)
    assert monitor.lag_s < 0.05
    task.cancel()


async def test_renewed_channels_to_an_unreachable_peer_are_closed(monkeypatch):
    monkeypatch.setattr(peer_client, "RENEW_FAILING_CHANNEL_AFTER_S", 0.0)
    monkeypatch.setattr(peer_client, "RETIRED_CHANNEL_GRACE_S", 0.05)
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1), PeerAddress("n1", "127.0.0.1", 9)),
                           data_dir="/nonexistent")
    transport = GrpcTransport(config)
    for _ in range(20):
        with pytest.raises(TransportError):
            await transport.heartbeat("n1", pb.HeartBeatRequest(), timeout=0.05)
    await asyncio.sleep(0.5)
    assert transport.open_channels == 1
    await transport.close()


async def test_pushes_to_an_unreachable_peer_all_fail_and_leave_nothing_unretrieved(caplog):
    # Several requests race for one stream that breaks: each caller gets its
    # TransportError, and no failed future is left for asyncio to log.
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1), PeerAddress("n1", "127.0.0.1", 9)),
                           data_dir="/nonexistent")
    transport = GrpcTransport(config)
    for _ in range(5):
        outcomes = await asyncio.gather(*(transport.heartbeat("n1", pb.HeartBeatRequest(), timeout=1.0)
                                          for _ in range(4)), return_exceptions=True)
        assert all(isinstance(outcome, TransportError) for outcome in outcomes), outcomes
    del outcomes
    gc.collect()
    await asyncio.sleep(0.05)
    gc.collect()
    assert "never retrieved" not in caplog.text
    await transport.close()
