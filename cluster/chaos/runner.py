"""One chaos run from start to verdict:

1. start a FaultNetwork (a proxy per directed peer link) and the node
   processes, each reaching its peers through the proxies and advertising
   its real address to clients;
2. run the workload for `duration_s` while the nemesis carries out the
   seeded schedule;
3. heal everything, stop the load, make one more acknowledged append (so a
   leader of the final term has committed), wait until every node has
   committed it;
4. read every node's committed log and run the checker (the broker
   workload: wait until no node commits anything new, read the logs, stop
   the nodes with SIGTERM and digest each one's ConsumeQueues, consumer
   offsets and pop state for the broker checker);
5. write summary.json, history.jsonl and timeline.png under the output dir.

The node data dirs (`data/`) are removed after a valid run and kept after a
failed one, with the committed logs as `logs/<node>.jsonl`, for a post mortem.

With `secure` the cluster runs as `cluster up --secure` makes it: a CA and
node certificates under `pki/`, TLS for clients, mutual TLS between peers
(the fault proxies carry the peers' TLS bytes unchanged), authentication and
ACLs on with the super user `admin` (`admin.secret`). Every client of the
run (the workload's, the official client's, the harness's own) signs as
admin and trusts the CA, through DLEDGER_USER, DLEDGER_SECRET_FILE and
DLEDGER_TLS_CA, set for the run.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import secrets
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from cluster.chaos.availability import (longest_delivery_gap, longest_gap, recoveries, recovery_by_kind,
                                        recovery_stats)
from cluster.chaos.broker_checker import BrokerCheckResult, check_broker
from cluster.chaos.checker import CheckResult, LogEntry, check
from cluster.chaos.disk import RepairSummary, repair_summary
from cluster.chaos.history import PROBE_PREFIX, History, Operation, Outcome
from cluster.chaos.node_state import digest_node
from cluster.chaos.nemesis import Nemesis
from cluster.chaos.network import FaultNetwork
from cluster.chaos.plot import plot_timeline
from cluster.chaos.schedule import ALL_KINDS, CRASH_WRITE, KILL_LEADER, MEMBER_CHANGE, ScheduleConfig, plan_schedule
from cluster.chaos.workload import LogWorkloadConfig, Workload, make_workload
from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from dledger.rpc.credentials import ENV_SECRET_FILE, ENV_TLS_CA, ENV_USER

log = logging.getLogger(__name__)

# Small segments: a run writes megabytes, not gigabytes, and DLedger's 1 GiB
# preallocated data files (3 GiB per run) fill a shared disk; rolling segments
# also puts segment ends under the crashes. Flags given later override these.
# A scrubber pass every second finds a flipped bit (the `disk` faults) while
# the run lasts; the logs are megabytes, so that costs little.
STORAGE_ARGS = ("--data-file-size", str(16 << 20), "--index-file-size", str(1 << 20),
                "--scrub-pass-interval", "1")
# Ids reserved beyond --nodes for the servers membership changes add.
SPARE_MEMBERS = 2


@dataclass(frozen=True)
class ChaosOptions:
    out_dir: Path
    nodes: int = 3
    duration_s: float = 60.0
    faults: tuple[str, ...] = ALL_KINDS
    seed: int | None = None
    workload: str = "log"
    node_args: tuple[str, ...] = ()
    # LogWorkloadConfig, or BrokerWorkloadConfig for the broker workload.
    workload_config: Any = field(default_factory=LogWorkloadConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    convergence_timeout_s: float = 30.0
    keep_data: bool = False
    # TLS, mutual TLS between peers, authentication and ACLs (module docstring).
    secure: bool = False
    # The broker workload's nodes get front ends (broker/config.py): routes
    # then send the official client to ports no leader holds.
    front_ends: bool = True
    # A member is moved only once the leader has not heard from it for two
    # election timeouts (dledger/server.py): wait a little longer.
    move_silence_s: float = 2.5


@dataclass
class RunState:
    """What a run gathers on its way to the summary."""
    seed: int
    history: History
    load_end_s: float = 0.0
    sends_end_s: float | None = None
    # The broker workload's client calls by path: messaging link or gRPC.
    client_call_paths: dict[str, int] | None = None
    crashed: dict[str, int] = field(default_factory=dict)
    unconverged: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    still_repairing: list[str] = field(default_factory=list)
    logs: dict[str, list[LogEntry]] = field(default_factory=dict)
    node_states: dict[str, dict[str, str]] = field(default_factory=dict)
    groups: list[Any] = field(default_factory=list)
    traffic: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    nemesis: Any = None


async def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    """Run, check, write the outputs; returns the summary (its "valid" says the verdict)."""
    started = time.monotonic()
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    cluster = _make_cluster(options, data_dir)
    # Faults act on peer traffic (with mutual TLS, on the peers' own ports),
    # with proxies in front of every address a node may have before any
    # node starts (membership changes add servers and move members).
    network = FaultNetwork({node: addresses[0] for node, addresses in cluster.peer_slots.items()},
                           link_of=cluster.link_addresses)
    await network.start()
    cluster.routes = network.routes(cluster.peer_slots)
    state = RunState(seed, History())
    try:
        with _client_credentials(options):
            cluster.start()
            await _run(options, cluster, network, state)
    finally:
        state.traffic = network.traffic()
        # The committed logs have been read: no need for a graceful stop
        # (which waits for gRPC's grace period).
        cluster.kill_all()
        await network.close()
    state.wall_s = time.monotonic() - started
    if options.workload == "broker":
        broker_result = check_broker(state.history, state.logs, state.groups, state.node_states) \
            if state.logs else None
        summary = build_broker_summary(options, state, broker_result)
    else:
        result = check(state.history, state.logs) if state.logs else None
        summary = build_summary(options, state, result)
    write_outputs(options, state, summary)
    if summary["valid"] and not options.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    return summary


ADMIN_USER = "admin"


def _make_cluster(options: ChaosOptions, data_dir: Path) -> ProcessCluster:
    out = options.out_dir
    args = [*STORAGE_ARGS, *options.node_args]
    front_ends = options.front_ends and options.workload == "broker"
    if not options.secure:
        # Membership changes add servers under spare ids and move members to
        # a second address: both are reserved now.
        changes_members = MEMBER_CHANGE in options.faults
        return ProcessCluster(data_dir, options.nodes, args, log_dir=out / "nodes", front_ends=front_ends,
                              spares=SPARE_MEMBERS if changes_members else 0, alternates=changes_members)
    if MEMBER_CHANGE in options.faults:
        raise ValueError("membership changes are not run against a secured cluster (--secure)")
    from cluster import certs
    pki = out / "pki"
    shutil.rmtree(pki, ignore_errors=True)
    secret_file = out / "admin.secret"
    secret_file.unlink(missing_ok=True)
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    cluster = ProcessCluster(data_dir, options.nodes, [*args, "--auth-enabled", "true", "--auth-super-user", ADMIN_USER,
                                                       "--auth-super-secret-file", str(secret_file)],
                             log_dir=out / "nodes", tls_dir=pki, front_ends=front_ends)
    # The client addresses are known once the cluster has its ports: the
    # official client verifies them as one name.
    certs.create(pki, cluster.ids, endpoints=list(cluster.addresses.values()),
                 endpoint_groups=[list(cluster.front_ends.values())] if cluster.front_ends else None)
    return cluster


@contextmanager
def _client_credentials(options: ChaosOptions) -> Iterator[None]:
    """Every client of a secure run signs as admin and trusts the run's CA."""
    if not options.secure:
        yield
        return
    wanted = {ENV_USER: ADMIN_USER, ENV_SECRET_FILE: str(options.out_dir / "admin.secret"),
              ENV_TLS_CA: str(options.out_dir / "pki" / "ca.pem")}
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _wait_until_joined(admin: DLedgerClient, cluster: ProcessCluster, timeout_s: float = 30.0) -> None:
    """Faults begin once every node has joined the leader's cluster. A node
    that starts seconds after the others on a loaded machine has not (it
    neither votes nor counts until a leader reaches it), and a first fault
    that kills the leader then leaves one voter: no failover until the
    leader is back, which measures the start-up, not the fault."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metas = [await admin.metadata(cluster.addresses[n]) for n in cluster.ids if cluster.running(n)]
        if all(m is not None and m.cluster_id and m.leader_id and not m.repairing for m in metas) \
                and len({m.cluster_id for m in metas if m is not None}) == 1:
            return
        await asyncio.sleep(0.1)
    log.warning("not every node joined the cluster within %.0fs; faults begin anyway", timeout_s)


async def _run(options: ChaosOptions, cluster: ProcessCluster, network: FaultNetwork, state: RunState) -> None:
    # Every address a node may ever listen on: clients find servers added later.
    servers = cluster.every_address
    deadline_s = getattr(options.workload_config, "op_deadline_s", 10.0)
    async with DLedgerClient(servers, deadline_s=deadline_s) as admin:
        await find_leader(admin, servers, timeout=30.0)
        await _wait_until_joined(admin, cluster)
        history = state.history = History()
        workload = make_workload(options.workload, servers, history, options.workload_config)
        state.groups = list(getattr(workload, "groups", []))
        nemesis = Nemesis(cluster, network, history, workload, admin, move_silence_s=options.move_silence_s)
        state.nemesis = nemesis
        plan = plan_schedule(state.seed, options.faults, options.duration_s, options.schedule)
        stop = asyncio.Event()
        load = asyncio.ensure_future(workload.run(stop))
        try:
            await nemesis.run(plan)
            await asyncio.sleep(max(0.0, options.duration_s - history.now()))
        finally:
            state.crashed = cluster.exited()
            nemesis.heal_everything()
            stop.set()
            await load
        if MEMBER_CHANGE in options.faults:
            # The members are whom the configuration names, whatever the
            # last change's fate: the checks run on them.
            await nemesis.membership.reconcile()
            nemesis.heal_everything()
        state.load_end_s = history.now()
        state.sends_end_s = getattr(workload, "sends_ended_s", None)
        state.client_call_paths = getattr(workload, "call_paths", None)
        await _converge(options, cluster, admin, workload, state)


async def _converge(options: ChaosOptions, cluster: ProcessCluster, admin: DLedgerClient,
                    workload: Workload, state: RunState) -> None:
    alive = [n for n in cluster.ids if n not in state.crashed]
    try:
        barrier = await workload.barrier(options.convergence_timeout_s)
    except TimeoutError:
        # No leader after healing: a liveness failure. The logs are still
        # read and checked for what they hold.
        state.unconverged = alive
    else:
        if options.workload == "broker":
            barrier = await wait_quiet(admin, cluster, alive, options.convergence_timeout_s)
        state.unconverged = await wait_committed(admin, cluster, alive, barrier, options.convergence_timeout_s)
        state.still_repairing = await wait_repaired(admin, cluster, alive, options.convergence_timeout_s)
    state.crashed.update(cluster.exited())
    await _read_logs(admin, [n for n in alive if n not in state.crashed], state)
    # A read that met a damaged entry started a repair: let it finish, and
    # read those nodes again (a repairing node's log is cut short).
    repaired = [n for n in state.logs
                if (meta := await admin.metadata(cluster.addresses[n])) is not None and meta.repairing]
    if repaired:
        state.still_repairing = await wait_repaired(admin, cluster, repaired, options.convergence_timeout_s)
        await _read_logs(admin, repaired, state)
    if options.workload == "broker" and not state.unconverged:
        # A clean stop writes every node's derived state to its files. In a
        # thread: the fault proxies run on this loop, and blocked they would
        # hold the nodes' connections open (each stop then took its whole
        # gRPC grace, 2 s).
        await asyncio.to_thread(cluster.stop_all)
        state.node_states = {node: digest_node(cluster.base / node) for node in state.logs}


async def _read_logs(admin: DLedgerClient, nodes: list[str], state: RunState) -> None:
    for node in nodes:
        try:
            state.logs[node] = await read_log(admin, node)
        except DLedgerError as error:
            log.error("cannot read the committed log of %s: %s", node, error)
            state.unreadable.append(node)


async def wait_quiet(admin: DLedgerClient, cluster: ProcessCluster, nodes: list[str], timeout_s: float,
                     quiet_s: float = 1.5) -> int:
    """Wait until no node's committed index has moved for `quiet_s` (the
    broker writes offsets and pop ops on its own for a while after the load);
    returns the highest committed index then."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    last: tuple[int, ...] = ()
    since = loop.time()
    while loop.time() < give_up:
        answers = await asyncio.gather(*(admin.metadata(cluster.addresses[n]) for n in nodes))
        now = tuple(a.committed_index if a is not None else -1 for a in answers)
        if now != last:
            last, since = now, loop.time()
        elif loop.time() - since >= quiet_s and len(set(now)) == 1:
            break
        await asyncio.sleep(0.1)
    return max(last or (0,))


async def wait_committed(admin: DLedgerClient, cluster: ProcessCluster, nodes: list[str], index: int,
                         timeout_s: float) -> list[str]:
    """Wait until every node has committed `index`; returns the ones that did not."""
    return await _wait_nodes(admin, cluster, nodes, timeout_s,
                             lambda answer: answer is None or answer.committed_index < index)


async def wait_repaired(admin: DLedgerClient, cluster: ProcessCluster, nodes: list[str],
                        timeout_s: float) -> list[str]:
    """Wait until no node repairs its log any more; returns the ones that still do."""
    return await _wait_nodes(admin, cluster, nodes, timeout_s, lambda answer: answer is None or answer.repairing)


async def _wait_nodes(admin: DLedgerClient, cluster: ProcessCluster, nodes: list[str], timeout_s: float,
                      pending: Callable[[Any], bool]) -> list[str]:
    """Poll the nodes' metadata until `pending` holds for none (an
    unanswered probe counts as pending); returns the ones still pending."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    waiting = list(nodes)
    while waiting and loop.time() < give_up:
        answers = await asyncio.gather(*(admin.metadata(cluster.addresses[n]) for n in waiting))
        waiting = [n for n, answer in zip(waiting, answers) if pending(answer)]
        if waiting:
            await asyncio.sleep(0.1)
    return waiting


async def read_log(admin: DLedgerClient, node: str, attempts: int = 40) -> list[LogEntry]:
    """Node `node`'s whole committed log, the log's own entries included (so
    that holes and differences in NOOPs and producer marks show too). A node
    whose read meets a damaged entry repairs itself: read again once it has."""
    for attempt in range(attempts):
        try:
            return [LogEntry(e.index, e.term, e.body, e.chain_crc, e.magic)
                    async for e in admin.read(from_id=node, include_system=True)]
        except DLedgerError as error:
            if error.code is not ResponseCode.CORRUPT_LOG or attempt == attempts - 1:
                raise
            log.info("%s is repairing a damaged entry its log read met; reading again", node)
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ output

def build_summary(options: ChaosOptions, state: RunState, result: CheckResult | None) -> dict[str, Any]:
    history = state.history
    ops = [op for op in history.operations if not op.client.startswith(PROBE_PREFIX)]
    probes = [op for op in history.operations if op.client.startswith(PROBE_PREFIX)]
    gap = longest_gap(history, 0.0, state.load_end_s)
    per_fault = recoveries(history)
    counts = result.counts() if result else {}
    repairs = repair_summary(options.out_dir / "nodes")
    problems = _problems(state, result is None, result is not None and not result.valid, repairs)
    return {
        "seed": state.seed,
        "nodes": options.nodes,
        "duration_s": options.duration_s,
        "workload": options.workload,
        "secure": options.secure,
        "faults": list(options.faults),
        "ops": len(ops),
        "acked": sum(op.outcome is Outcome.OK for op in ops),
        "failed": sum(op.outcome is Outcome.FAIL for op in ops),
        "unknown": sum(op.outcome in (Outcome.UNKNOWN, Outcome.PENDING) for op in ops),
        "acked_entries": sum(len(op.ids) for op in ops if op.outcome is Outcome.OK),
        "unknown_landed": result.unknown_present if result else None,
        "committed_entries": result.committed_entries if result else None,
        "node_system_entries": result.system_entries if result else None,
        "probe_ops": len(probes),
        "lost": counts.get("lost"),
        "duplicated": counts.get("duplicated"),
        "diverged": counts.get("diverged"),
        "order_violations": counts.get("order_violations"),
        "unexpected": counts.get("unexpected"),
        "misplaced": counts.get("misplaced"),
        "failed_present": counts.get("failed_present"),
        "stale_leader_acks": counts.get("stale_leader_acks"),
        **_repair_fields(repairs, state),
        **_membership_fields(options, state),
        "crashed_nodes": state.crashed,
        "unconverged_nodes": state.unconverged,
        "unreadable_nodes": state.unreadable,
        "max_unavailability_s": round(gap.seconds, 3),
        "max_unavailability_window_s": [round(gap.from_s, 3), round(gap.to_s, 3)],
        "faults_injected": len(per_fault),
        "peer_traffic": state.traffic,
        "recovery": recovery_stats(per_fault),
        # A leader SIGKILLed on its own: the time until a client's append is
        # acknowledged again.
        "failover": recovery_stats(per_fault, (KILL_LEADER, CRASH_WRITE), solo=True),
        "recovery_by_kind": recovery_by_kind(per_fault),
        "per_fault": [_rounded(asdict(r)) for r in per_fault],
        "examples": result.examples() if result else {},
        "wall_s": round(state.wall_s, 1),
        "valid": not any(problems.values()),
        "outputs": _outputs(options),
    }


def _problems(state: RunState, no_logs: bool, checks_failed: bool, repairs: RepairSummary) -> dict[str, bool]:
    """What makes a run invalid, whatever its workload."""
    return {
        "no_logs_read": no_logs,
        "crashed_nodes": bool(state.crashed),
        "unconverged_nodes": bool(state.unconverged),
        "unreadable_nodes": bool(state.unreadable),
        "checks": checks_failed,
        "unsafe_repair_votes": repairs.unsafe_repair_votes > 0,
        "still_repairing": bool(state.still_repairing),
    }


def _repair_fields(repairs: RepairSummary, state: RunState) -> dict[str, Any]:
    return {"repairs": repairs.repairs, "repairs_completed": repairs.completed,
            "votes_while_repairing": repairs.votes_while_repairing, "unsafe_repair_votes": repairs.unsafe_repair_votes,
            "still_repairing": state.still_repairing}


def _membership_fields(options: ChaosOptions, state: RunState) -> dict[str, Any]:
    if MEMBER_CHANGE not in options.faults or state.nemesis is None:
        return {}
    changer = state.nemesis.membership
    return {"member_changes": changer.changes, "member_changes_completed": changer.completed,
            "members_at_end": sorted(state.logs)}


def _outputs(options: ChaosOptions) -> dict[str, str]:
    return {"summary": str(options.out_dir / "summary.json"), "history": str(options.out_dir / "history.jsonl"),
            "timeline": str(options.out_dir / "timeline.png"), "node_logs": str(options.out_dir / "nodes")}


def build_broker_summary(options: ChaosOptions, state: RunState, result: BrokerCheckResult | None
                         ) -> dict[str, Any]:
    history = state.history
    sends = [op for op in history.operations if op.kind == "send"]
    official = [op for op in sends if op.client == "official"]
    # Until the producers stopped (the consumers' drain comes after).
    gap = longest_gap(history, 0.0, state.sends_end_s or state.load_end_s)
    delivery_gap = longest_delivery_gap(history, 0.0, state.sends_end_s or state.load_end_s)
    per_fault = recoveries(history)
    counts = result.counts() if result else {}
    repairs = repair_summary(options.out_dir / "nodes")
    problems = _problems(state, result is None, result is not None and not result.valid, repairs)

    def tally(ops: list[Operation]) -> dict[str, int]:
        return {outcome.value: sum(op.outcome is outcome for op in ops) for outcome in Outcome}

    calls = {kind: tally([op for op in history.operations if op.kind == kind])
             for kind in ("send", "end", "receive", "ack")}
    kinds: dict[str, int] = {}
    for message in history.sent.values():
        kinds[message.kind] = kinds.get(message.kind, 0) + 1
    leader_kills = (KILL_LEADER, CRASH_WRITE)
    return {
        "seed": state.seed,
        "nodes": options.nodes,
        "duration_s": options.duration_s,
        "workload": options.workload,
        "secure": options.secure,
        "faults": list(options.faults),
        "messages": len(history.sent),
        "messages_by_kind": kinds,
        "ops": len(sends),
        "acked": sum(op.outcome is Outcome.OK for op in sends),
        "failed": sum(op.outcome is Outcome.FAIL for op in sends),
        "unknown": sum(op.outcome in (Outcome.UNKNOWN, Outcome.PENDING) for op in sends),
        "official_sends": tally(official),
        "calls": calls,
        "failed_client_calls": sum(c["fail"] + c["unknown"] for c in calls.values()),
        # Of those, the official client's (its sends, receives and acks).
        "official_failed_calls": {kind: sum(op.kind == kind and op.client.startswith("official")
                                            and op.outcome in (Outcome.FAIL, Outcome.UNKNOWN)
                                            for op in history.operations) for kind in ("send", "receive", "ack")},
        "front_ends": options.front_ends,
        "client_call_paths": state.client_call_paths,
        "deliveries": result.deliveries if result else None,
        "redeliveries": result.redeliveries if result else None,
        "dead_lettered": result.dead_lettered if result else None,
        "check_backs": len(history.checks),
        "unknown_sends_landed": result.unknown_sends_landed if result else None,
        **{name: counts.get(name) for name in BrokerCheckResult.FAILURES},
        "late_delayed": result.late_delayed if result else None,
        **_repair_fields(repairs, state),
        "crashed_nodes": state.crashed,
        "unconverged_nodes": state.unconverged,
        "unreadable_nodes": state.unreadable,
        "state_items_compared": len(next(iter(state.node_states.values()), {})),
        "max_unavailability_s": round(gap.seconds, 3),
        "max_unavailability_window_s": [round(gap.from_s, 3), round(gap.to_s, 3)],
        "max_without_delivery_s": round(delivery_gap.seconds, 3),
        "max_without_delivery_window_s": [round(delivery_gap.from_s, 3), round(delivery_gap.to_s, 3)],
        "faults_injected": len(per_fault),
        "peer_traffic": state.traffic,
        "recovery": recovery_stats(per_fault),
        "delivery_recovery": recovery_stats(per_fault, measure="delivery_recovery_s"),
        # A leader SIGKILLed on its own: until a send is acknowledged again,
        # and until a message is delivered again.
        "failover": recovery_stats(per_fault, leader_kills, solo=True),
        "failover_delivery": recovery_stats(per_fault, leader_kills, solo=True, measure="delivery_recovery_s"),
        "recovery_by_kind": recovery_by_kind(per_fault),
        "delivery_recovery_by_kind": recovery_by_kind(per_fault, measure="delivery_recovery_s"),
        "per_fault": [_rounded(asdict(r)) for r in per_fault],
        "examples": result.examples() if result else {},
        "wall_s": round(state.wall_s, 1),
        "valid": not any(problems.values()),
        "outputs": _outputs(options),
    }


def write_outputs(options: ChaosOptions, state: RunState, summary: dict[str, Any]) -> None:
    out = options.out_dir
    state.history.write(out / "history.jsonl")
    plot_timeline(state.history, out / "timeline.png",
                  f"dledger chaos: seed {state.seed}, {options.nodes} nodes, {options.duration_s:g} s, "
                  f"{'valid' if summary['valid'] else 'INVALID'}")
    if not summary["valid"]:
        (out / "logs").mkdir(exist_ok=True)
        for node, entries in state.logs.items():
            with open(out / "logs" / f"{node}.jsonl", "w") as file:
                for e in entries:
                    file.write(json.dumps({"index": e.index, "term": e.term, "magic": e.magic, "chain_crc": e.chain_crc,
                                           "body_base64": base64.b64encode(e.body).decode()}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
