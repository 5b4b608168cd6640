"""Metadata snapshots in the log: every ConfigManager's whole state as one entry.

Topics, groups, offsets and the broker's bookkeeping change through system
entries; retention deletes old segments, and with them the entries that
created, say, a topic. A node whose log begins after them (a new disk, or a
follower reset to the leader's first retained entry) would never learn of
the topic. So the leader periodically writes a METADATA_SNAPSHOT entry
holding the state of every manager as of an entry it has applied: `asOf`.

Writes are not held while it does: the capture is one synchronous step on
the event loop, so the state is exactly that of entry asOf, and a cheap one
(the pop state begins a capture that journals later changes and copies
nothing: store/captured_dict.py; small managers encode at once); the
copying and encoding then run in a worker thread (about a second for a
million leases) while entries go on landing, and the snapshot is appended
after them, at some index > asOf. Entries between asOf
and the snapshot are thus not in it. Two designs keep every replica equal:
hold those entries back on a replica until it meets the snapshot (it cannot
know one is coming), or re-apply them after adopting it. We re-apply:

- a replica whose managers hold the whole history changes nothing (its
  state already includes asOf and every entry after it);
- a replica that adopts (a manager in `incomplete`: its log began after
  entries it never applied) replaces that manager's state by the state as
  of asOf, then applies to it again, from its own log, the entries
  asOf+1 .. snapshot-1 of the manager's kinds. It applied them once before
  to the state it is now discarding, so each counts exactly once.

Re-applying needs those entries in the log: retention keeps everything after
the latest snapshot's asOf (`retention_floor`), on the leader (whose log a
reset follower copies) and on every replica. Snapshots written before asOf
existed hold the state as of the entry before them (asOf = index - 1), as
the leader held writes then: nothing to re-apply.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

from store.config_manager import ConfigManager
from store.system_entry import SystemKind, encode_system_entry

log = logging.getLogger(__name__)


# Applies the log's entries first..last (those of the managers' kinds) to
# the managers again; see the module's docstring.
Replay = Callable[[int, int, Sequence[ConfigManager]], bool]


def capture_payload(managers: Sequence[ConfigManager], as_of: int | None = None) -> Callable[[], dict[str, Any]]:
    """Every manager's state as of now, which is entry `as_of` (None: the
    entry before the snapshot, the old format); the payload is built when
    the returned function is called, which may be in a worker thread."""
    captures = {manager.file_name: manager.capture() for manager in managers if manager.in_metadata_snapshot}
    extra = {} if as_of is None else {"asOf": as_of}
    return lambda: {"managers": {name: capture() for name, capture in captures.items()}, **extra}


def encode_snapshot(payload: Callable[[], dict[str, Any]]) -> bytes:
    """The entry's bytes (in a worker thread: a million leases take ~0.4 s)."""
    return encode_system_entry(SystemKind.METADATA_SNAPSHOT, payload())


def snapshot_as_of(index: int, payload: dict[str, Any]) -> int:
    """The entry a snapshot's state is as of: its asOf, or for snapshots
    written before it existed, the entry before the snapshot."""
    as_of = payload.get("asOf")
    if not isinstance(as_of, int) or isinstance(as_of, bool) or not -1 <= as_of < index:
        return index - 1
    return as_of


class MetadataSnapshotHandler:
    """Applies METADATA_SNAPSHOT entries to the managers, in log order."""

    kinds = frozenset({SystemKind.METADATA_SNAPSHOT})

    def __init__(self, managers: Sequence[ConfigManager], replay: Replay | None = None) -> None:
        self.managers = managers
        self.replay = replay   # set by the store once its apply loop exists
        self.last_index = -1
        self.last_as_of = -1   # the latest snapshot's asOf: retention keeps the entries after it
        self.applied_at = time.monotonic()  # when this node last applied one (or started)
        # Managers whose state may lack entries this node never applied; only
        # these take a snapshot's state. The others already hold exactly it,
        # and decoding a big pop state anew (a million leases: 1.5 s) would
        # stall every node's event loop at every snapshot.
        self.incomplete: set[str] = set()

    def retention_floor(self) -> int:
        """The first entry the log must keep for the latest snapshot: the
        first one after its asOf (a replica adopting it re-applies those)."""
        return self.last_as_of + 1

    def start(self, resumed_at: int, log_lost_entries: bool) -> None:
        """The store resumes applying after `resumed_at`. A manager may lack
        entries if the log no longer holds some it never applied (a new
        disk), or if its file was missing while the store resumes past the
        log's start (the file was lost, not never written)."""
        self.incomplete = {m.file_name for m in self.managers
                           if log_lost_entries or (not m.loaded and resumed_at >= 0)}

    def on_gap(self, first_index: int) -> None:
        """The log now starts after entries this node never applied."""
        log.info("entries before %d were never applied here: metadata comes from the next snapshot", first_index)
        self.incomplete = {manager.file_name for manager in self.managers}

    def apply(self, index: int, kind: int, payload: dict[str, Any]) -> None:
        as_of = snapshot_as_of(index, payload)
        if index > self.last_index:
            self.last_index, self.last_as_of = index, as_of
        self.applied_at = time.monotonic()
        states = payload.get("managers", {})
        adopted: list[ConfigManager] = []
        for manager in self.managers:
            state = states.get(manager.file_name)
            if state is None or index <= manager.applied_index:
                continue  # not in this snapshot, or the manager's file is newer
            if manager.file_name in self.incomplete:
                manager.adopt(state)
                manager.applied_index = as_of   # what it holds now; the rest follows
                self.incomplete.discard(manager.file_name)
                adopted.append(manager)
        if adopted and as_of < index - 1:
            self._reapply(as_of + 1, index - 1, adopted)
        for manager in self.managers:
            if manager.file_name in states and index > manager.applied_index:
                manager.applied_index = index

    def _reapply(self, first: int, last: int, managers: list[ConfigManager]) -> None:
        names = ", ".join(m.file_name for m in managers)
        if self.replay is None:
            log.error("entries %d..%d cannot be applied again to %s after a snapshot: no log here",
                      first, last, names)
            return
        log.info("adopted a metadata snapshot as of entry %d: applying entries %d..%d to %s again",
                 first - 1, first, last, names)
        if not self.replay(first, last, managers):
            # A damaged entry among them (being repaired): these managers lack
            # what followed it, so the next snapshot's state replaces theirs.
            log.error("applying entries %d..%d to %s again stopped at a damaged entry: they take the next "
                      "metadata snapshot's state", first, last, names)
            self.incomplete.update(m.file_name for m in managers)
