"""Failover as the official RocketMQ 5 Python client sees it: its Producer
sends one message at a time (`producer.send`, about 20 a second) and its
SimpleConsumer receives and acks, while the leader of a three-node cluster is
SIGKILLed, restarted and caught up (`--fault kill`), or SIGSTOPped for 3 s and
resumed (`--fault pause`), round after round; the next round's fault comes 2 s
after the client has sent and received again (at most 30 s after the last
fault). Per round: the time from the
fault to the next acknowledged send and to the next delivered message; over
the run: every failed send, receive and ack (with the first errors), and
every acknowledged send that was never delivered.

    python -m bench.broker_failover [--rounds 5] [--fault kill|pause] [--front-ends on|off] [--dir DIR]

`--front-ends on` (the default) gives the nodes front ends (broker/config.py):
routes then point the client at ports that never belong to the leader;
`off` routes it to every node's own port (the first that answers).

{"round", "fault", "node", "next_send_ms", "next_delivery_ms"} ... then
{"rounds", "fault", "front_ends", "sends", "failed_sends", "failed_receives", "failed_acks", "undelivered",
 "next_send_ms": {median, worst}, "next_delivery_ms": {median, worst}}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.client import AdminClient
from cluster.process_cluster import ROOT, ProcessCluster, find_leader
from dledger.client import DLedgerClient

TOPIC, GROUP = "FailoverOfficial", "FailoverOfficialGroup"
SEND_RATE = 20.0
BEFORE_KILL_S = 2.0
AFTER_KILL_S = 3.0
# A round ends once the client has sent and received again after the fault
# (or this long after it, the round's figure then missing). The next fault
# comes BEFORE_KILL_S after that: a fault before the last one's recovery (a
# node killed while calls it held as a front end still drain) is another test.
RECOVERY_LIMIT_S = 30.0
# A pause lasts several election timeouts (0.5-1 s): the group elects
# another leader meanwhile, as the chaos harness's pause-leader does.
PAUSE_S = 3.0
FAULTS = ("kill", "pause")


class Events:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.started = asyncio.Event()

    async def read(self, stdout: asyncio.StreamReader) -> None:
        async for line in stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.lines.append(event)
            if event["type"] == "started":
                self.started.set()

    async def recovered(self, fault_at: float, limit: float) -> None:
        """Until a send was acknowledged and a message delivered after the
        fault, or `limit` (time.monotonic())."""
        while time.monotonic() < limit:
            if self.first_after("send-ok", fault_at) is not None and \
                    self.first_after("delivery", fault_at) is not None:
                return
            await asyncio.sleep(0.1)

    def first_after(self, kind: str, moment: float) -> float | None:
        times = [e["time"] for e in self.lines if e["type"] == kind and e["time"] >= moment]
        return min(times) - moment if times else None


async def run(rounds: int, base: Path, fault: str = "kill", front_ends: bool = True,
              events_file: Path | None = None) -> dict[str, Any]:
    # (An older ProcessCluster, which knows no front ends, for A/B runs.)
    cluster = ProcessCluster(base, extra_args=["--preallocate", "false"], **({"front_ends": True} if front_ends else {}))
    cluster.start()
    addresses = list(cluster.addresses.values())
    try:
        async with DLedgerClient(addresses) as client:
            await find_leader(client, addresses, timeout=30)
            async with AdminClient(addresses, deadline_s=30) as admin:
                await admin.create_topic(TOPIC, 4)
                await admin.create_group(GROUP)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cluster.chaos.official_client", "--servers", ";".join(addresses),
                "--topic", TOPIC, "--group", GROUP, "--rate", str(SEND_RATE), "--prefix", "f", cwd=ROOT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
            assert process.stdin is not None and process.stdout is not None
            events = Events()
            reader = asyncio.ensure_future(events.read(process.stdout))
            await asyncio.wait_for(events.started.wait(), 60)
            results = []
            for number in range(1, rounds + 1):
                await asyncio.sleep(BEFORE_KILL_S)
                leader = await find_leader(client, addresses)
                fault_at = time.monotonic()
                if fault == "kill":
                    cluster.kill(leader)
                    await asyncio.sleep(AFTER_KILL_S)
                    cluster.start(leader)
                else:
                    cluster.pause(leader)
                    await asyncio.sleep(PAUSE_S)
                    cluster.resume(leader)
                    await asyncio.sleep(AFTER_KILL_S - PAUSE_S if AFTER_KILL_S > PAUSE_S else 0.5)
                await events.recovered(fault_at, fault_at + RECOVERY_LIMIT_S)
                send = events.first_after("send-ok", fault_at)
                delivery = events.first_after("delivery", fault_at)
                row = {"round": number, "fault": fault, "node": leader,
                       "next_send_ms": None if send is None else round(send * 1000, 1),
                       "next_delivery_ms": None if delivery is None else round(delivery * 1000, 1)}
                print(json.dumps(row), flush=True)
                results.append(row)
            process.stdin.write(b"stop\n")
            await process.stdin.drain()
            await drain(events)
            process.stdin.write(b"finish\n")
            await process.stdin.drain()
            process.stdin.close()
            await asyncio.wait_for(process.wait(), 60)
            await reader
    finally:
        cluster.stop_all()
    if events_file is not None:
        events_file.write_text("".join(json.dumps(e) + "\n" for e in events.lines))
    return {"fault": fault, "front_ends": front_ends, **summarise(events, results)}


async def drain(events: Events, timeout_s: float = 30.0) -> None:
    """Until every acknowledged send was delivered (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        acked = {e["uid"] for e in events.lines if e["type"] == "send-ok"}
        delivered = {e["uid"] for e in events.lines if e["type"] == "delivery"}
        if acked <= delivered:
            return
        await asyncio.sleep(0.2)


def summarise(events: Events, rows: list[dict[str, Any]]) -> dict[str, Any]:
    def count(kind: str) -> int:
        return sum(1 for e in events.lines if e["type"] == kind)

    acked = {e["uid"] for e in events.lines if e["type"] == "send-ok"}
    delivered = {e["uid"] for e in events.lines if e["type"] == "delivery"}

    def stats(key: str) -> dict[str, float | None]:
        values = [r[key] for r in rows if r[key] is not None]
        return {"median": statistics.median(values) if values else None, "worst": max(values, default=None),
                "missing": len(rows) - len(values)}

    return {"rounds": len(rows), "sends": count("send"), "acked_sends": len(acked),
            "failed_sends": count("send-fail"), "failed_receives": count("receive-fail"),
            "failed_acks": count("ack-fail"), "undelivered": len(acked - delivered),
            "undelivered_ids": sorted(acked - delivered)[:10],
            "send_errors": [e["error"] for e in events.lines if e["type"] == "send-fail"][:5],
            "receive_errors": [e["error"] for e in events.lines if e["type"] == "receive-fail"][:5],
            "ack_errors": [e["error"] for e in events.lines if e["type"] == "ack-fail"][:5],
            "next_send_ms": stats("next_send_ms"), "next_delivery_ms": stats("next_delivery_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fault", choices=FAULTS, default="kill")
    parser.add_argument("--front-ends", choices=("on", "off"), default="on")
    parser.add_argument("--dir", type=Path, help="node data (default: a temporary directory, removed after)")
    parser.add_argument("--events", type=Path, help="write every client event here (JSON lines)")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="broker-failover-"))
    try:
        print(json.dumps(asyncio.run(run(args.rounds, base, args.fault, args.front_ends == "on", args.events))), flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
