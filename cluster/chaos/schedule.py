"""The nemesis schedule: which faults, when and for how long, planned from a
seed before the run starts, so that a failing run can be replayed with the
same `--seed` (and the same `--faults` and `--duration`).

The plan fixes the kinds, the times and a seed per fault for the choices made
when it is injected (which node, which side of a split, which direction);
"the leader" is whoever leads at that moment, so it is resolved then.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

# Every fault kind the nemesis knows.
KILL_LEADER = "kill-leader"        # SIGKILL the leader, restart it on the same data dir later
KILL_RANDOM = "kill-random"        # SIGKILL any node
CRASH_WRITE = "crash-write"        # SIGKILL the leader in the middle of heavy appends
ISOLATE_LEADER = "isolate-leader"  # cut the leader off from every follower (both directions)
SPLIT = "split"                    # random majority / minority halves
ONE_WAY = "one-way"                # one node's bytes to the others (or theirs to it) dropped
PAUSE_LEADER = "pause-leader"      # SIGSTOP the leader for longer than the election timeout, then SIGCONT
DELAY = "delay"                    # add latency to every peer link
COMBO = "combo"                    # two of the above at once, the second starting a little later
# Storage faults (cluster/chaos/disk.py): the node must repair itself.
BITFLIP_STOPPED = "bitflip-stopped"  # stop a node, flip a bit of a committed entry, start it again
BITFLIP_RUNNING = "bitflip-running"  # flip a bit of a committed entry under a running node
TORN_TAIL = "torn-tail"              # SIGKILL a node, cut its data past its last fsync, add garbage
FSYNC_FAIL = "fsync-fail"            # a node's next fdatasync fails (it must stop); restart it
WIPE_DISK = "wipe-disk"              # a node comes back with an empty data directory
# Membership (cluster/chaos/membership.py): add a server, remove one, replace
# one by a new id or move one to a new address, the leader killed mid-change
# now and then.
MEMBER_CHANGE = "member-change"

BASE_KINDS = (KILL_LEADER, KILL_RANDOM, CRASH_WRITE, ISOLATE_LEADER, SPLIT, ONE_WAY, PAUSE_LEADER, DELAY)
DISK_KINDS = (BITFLIP_STOPPED, BITFLIP_RUNNING, TORN_TAIL, FSYNC_FAIL, WIPE_DISK)
MEMBERSHIP_KINDS = (MEMBER_CHANGE,)
ALL_KINDS = BASE_KINDS + (COMBO,) + DISK_KINDS + MEMBERSHIP_KINDS
ALIASES: dict[str, tuple[str, ...]] = {
    "kill": (KILL_LEADER, KILL_RANDOM, CRASH_WRITE),
    "partition": (ISOLATE_LEADER, SPLIT, ONE_WAY),
    "pause": (PAUSE_LEADER,),
    "disk": DISK_KINDS,
    "membership": MEMBERSHIP_KINDS,
    # Not the membership changes: the seeds of `all` plan the schedules they
    # planned before those existed (and the broker workload runs `all`).
    "all": BASE_KINDS + (COMBO,) + DISK_KINDS,
}


def parse_faults(text: str) -> tuple[str, ...]:
    """`kill,partition,pause,...` -> the fault kinds, aliases expanded, in a stable order."""
    chosen: set[str] = set()
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        if item in ALIASES:
            chosen.update(ALIASES[item])
        elif item in ALL_KINDS:
            chosen.add(item)
        else:
            names = ", ".join(list(ALIASES) + list(ALL_KINDS))
            raise ValueError(f"unknown fault {item!r}; expected some of: {names}")
    if not chosen:
        raise ValueError("no faults given")
    return tuple(k for k in ALL_KINDS if k in chosen)


@dataclass(frozen=True)
class ScheduleConfig:
    warmup_s: float = 1.0                         # load before the first fault
    quiet_s: tuple[float, float] = (1.0, 3.0)     # healthy time between two faults
    fault_s: tuple[float, float] = (1.5, 4.0)     # how long one fault lasts
    # A paused leader must stay paused past the followers' election timeout,
    # or nothing interesting happens: set to twice the maximum.
    min_pause_s: float = 2.0
    cooldown_s: float = 1.0                       # healthy load after the last fault


@dataclass(frozen=True)
class PlannedFault:
    number: int
    kind: str
    at_s: float          # since the workload started
    duration_s: float
    seed: int            # for the choices made at injection
    parts: tuple[str, ...] = ()   # COMBO: the two kinds combined
    stagger_s: float = 0.0        # COMBO: the second part starts this much later


def plan_schedule(seed: int, kinds: tuple[str, ...], duration_s: float,
                  config: ScheduleConfig = ScheduleConfig()) -> list[PlannedFault]:
    """Faults back to back with quiet gaps until `duration_s` (at least one)."""
    rng = random.Random(seed)
    plan: list[PlannedFault] = []
    at = config.warmup_s
    while True:
        kind = rng.choice(kinds)
        length = rng.uniform(*config.fault_s)
        parts = _combo_parts(rng, kinds) if kind == COMBO else ()
        room = duration_s - config.cooldown_s - at
        if room < length:
            if plan:
                break
            length = max(room, 0.5)  # a short run still gets its one fault
        if PAUSE_LEADER in (kind, *parts):
            length = max(length, config.min_pause_s)
        stagger = rng.uniform(0.0, length / 2) if parts else 0.0
        plan.append(PlannedFault(len(plan) + 1, kind, round(at, 3), round(length, 3), rng.getrandbits(32),
                                 parts, round(stagger, 3)))
        at += length + rng.uniform(*config.quiet_s)
    return plan


def _combo_parts(rng: random.Random, kinds: tuple[str, ...]) -> tuple[str, ...]:
    # Two storage faults at once could damage a majority: combos take at most one.
    pool = [k for k in kinds if k != COMBO]
    if sum(k in DISK_KINDS for k in pool) > 1:
        first = rng.choice(pool)
        rest = [k for k in pool if k != first and not (first in DISK_KINDS and k in DISK_KINDS)]
        return (first, rng.choice(rest)) if rest else (first, rng.choice(BASE_KINDS))
    pool = [k for k in kinds if k != COMBO]
    if len(pool) < 2:
        pool = list(BASE_KINDS)
    return tuple(rng.sample(pool, 2))
