"""Storage faults for the nemesis: what a disk that lies, fails or is replaced
does to one node's files, done to the real files of a real node process.

- a bit flipped in the body of a random committed entry, while the node is
  stopped (found by recovery or by the scrubber once it runs again) or while
  it runs (found by the scrubber);
- a torn tail: the node is killed and its data cut at a random point past
  what it had really fsynced (it records that position for the harness, see
  dledger/failpoints.py), with garbage written there, as a power cut in the
  middle of writes leaves it;
- an fdatasync that fails once (the node must stop, not carry on);
- a wiped disk: the node comes back with an empty data directory.

The node must repair itself in each case: never vote while it lacks what it
acknowledged (see repair_summary), lose nothing acknowledged, and end with a
log identical to the others'.
"""
from __future__ import annotations

import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from dledger import failpoints
from dledger.entry import BLANK, HEADER, HEADER_SIZE, INDEX_RECORD, INDEX_RECORD_SIZE, MAGIC_BLANK, VALID_MAGICS


def store_dir(data_dir: Path, node: str) -> Path:
    return data_dir / node / f"dledger-{node}"


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


def _file_for(directory: Path, offset: int) -> tuple[Path, int]:
    """The segment file holding absolute `offset`, and the offset inside it."""
    files = _segments(directory)
    if not files:
        raise FileNotFoundError(f"no segments in {directory}")
    size = files[0].stat().st_size
    start = offset - offset % size
    return directory / f"{start:020d}", offset - start


def entry_location(base: Path, index: int) -> tuple[Path, int, int]:
    """(data file, offset in it, entry size) of entry `index`, from its index record."""
    path, at = _file_for(base / "index", index * INDEX_RECORD_SIZE)
    with open(path, "rb") as file:
        file.seek(at)
        _, pos, size, found, _ = INDEX_RECORD.unpack(file.read(INDEX_RECORD_SIZE))
    if found != index:
        raise ValueError(f"the index record of entry {index} names entry {found}")
    data, offset = _file_for(base / "data", pos)
    return data, offset, size


def flip_entry(base: Path, index: int, rng: random.Random) -> str:
    """Flip one bit of entry `index`: in its body, or in its header's channel
    field when the body is empty (a NOOP); both break its CRCs."""
    path, offset, size = entry_location(base, index)
    at = offset + HEADER_SIZE + rng.randrange(size - HEADER_SIZE) if size > HEADER_SIZE else offset + 33
    bit = 1 << rng.randrange(8)
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)[0]
        file.seek(at)
        file.write(bytes([byte ^ bit]))
    return f"entry {index}: bit {bit:#04x} at {path.name}+{at}"


@dataclass(frozen=True)
class TornTail:
    flushed: int      # where the node's fsynced data ended
    cut: int          # where the files now end (then garbage)
    written: int      # where its written data ended


def tear_tail(base: Path, failpoints_dir: Path, rng: random.Random) -> TornTail | None:
    """After SIGKILL: cut the data at a random point between the fsynced end
    and the written end, write garbage there, drop later segments."""
    flushed = failpoints.read_recorded(str(failpoints_dir), failpoints.FLUSHED_POSITION)
    directory = base / "data"
    if flushed is None or flushed <= 0 or not _segments(directory):
        return None   # nothing written yet (a node that just lost its disk, say)
    path, at = _file_for(directory, flushed)
    if not path.exists():
        return None
    written = flushed + _written_after(path, at)
    cut = rng.randint(flushed, written)
    cut_path, cut_at = _file_for(directory, cut)
    size = cut_path.stat().st_size
    garbage = rng.randbytes(rng.randint(1, 512))
    with open(cut_path, "r+b") as file:
        file.seek(cut_at)
        file.write(bytes(min(size - cut_at, (written - cut) + (64 << 10))))   # the unflushed bytes go
        file.seek(cut_at)
        file.write(garbage[:max(0, size - cut_at)])
    for later in _segments(directory):
        if int(later.name) > int(cut_path.name):
            later.unlink()
    return TornTail(flushed, cut, written)


def _written_after(path: Path, at: int) -> int:
    """How many bytes of entries follow `at` in this segment (walking headers)."""
    with open(path, "rb") as file:
        data = file.read()
    walked = at
    while walked + HEADER_SIZE <= len(data):
        magic, size = BLANK.unpack_from(data, walked)
        if magic == MAGIC_BLANK and size > 0:
            break
        if magic not in VALID_MAGICS or size < HEADER_SIZE or walked + size > len(data):
            break
        if HEADER.unpack_from(data, walked)[1] != size:
            break
        walked += size
    return walked - at


def wipe(data_dir: Path, node: str, failpoints_dir: Path) -> None:
    shutil.rmtree(data_dir / node, ignore_errors=True)
    # What the node recorded about its old files no longer holds.
    (failpoints_dir / failpoints.FLUSHED_POSITION).unlink(missing_ok=True)


# -------------------------------------------------------------------- checks

_REPAIR_START = re.compile(r"repairing (it )?from the leader|a non-voter until it holds|, repairing up to \d+")
_REPAIR_END = re.compile(r"repair complete")
_VOTE_GRANTED = re.compile(r"(?<!pre-)vote for \S+ in term \d+: ACCEPT(?P<floor>.*)")
# A process start: it loaded its term (saying if it repairs), or found none.
_PROCESS_START = re.compile(r"loaded term \d+ vote|currterm: a new node")
_FLOOR = re.compile(r"candidate log \((-?\d+), (-?\d+)\), repair floor \((-?\d+), (-?\d+)\)")


@dataclass
class RepairSummary:
    repairs: int = 0                   # repairs started (damage found, or a lost disk rejoining)
    completed: int = 0
    votes_while_repairing: int = 0     # granted by a repairing node (allowed, by the rule below)
    unsafe_repair_votes: int = 0       # must be 0: granted to a candidate behind the log the node had


def repair_summary(log_dir: Path) -> RepairSummary:
    """From the node logs: repairs started and completed, and the votes a node
    granted while repairing. The rule: only to a candidate whose log is at
    least as up to date as the log the node had before its cut (its repair
    floor); a node without a floor (it lost its disk) grants none."""
    summary = RepairSummary()
    for path in sorted(log_dir.glob("*.log")):
        repairing = False
        for line in path.read_text(errors="replace").splitlines():
            if _PROCESS_START.search(line) and not _REPAIR_START.search(line):
                repairing = False   # a new process that does not repair (a wipe ended the old repair)
            elif _REPAIR_START.search(line):
                summary.repairs += 0 if repairing else 1
                repairing = True
            elif _REPAIR_END.search(line):
                summary.completed += 1 if repairing else 0
                repairing = False
            elif (granted := _VOTE_GRANTED.search(line)) and "repairing:" in granted["floor"]:
                summary.votes_while_repairing += 1
                summary.unsafe_repair_votes += 0 if _vote_within_rule(granted["floor"]) else 1
            elif repairing and granted:
                # A grant without the repairing note while the node repairs.
                summary.votes_while_repairing += 1
                summary.unsafe_repair_votes += 1
    return summary


def _vote_within_rule(note: str) -> bool:
    match = _FLOOR.search(note)
    if match is None:
        return False    # "repair floor None": it had no floor and granted anyway
    cand_term, cand_index, floor_term, floor_index = map(int, match.groups())
    return (cand_term, cand_index) >= (floor_term, floor_index)
