"""Metadata snapshots in the log: every ConfigManager's whole state as one entry.

Topics, groups, offsets and the broker's bookkeeping change through system
entries; retention deletes old segments, and with them the entries that
created, say, a topic. A node whose log begins after them (a new disk, or a
follower reset to the leader's first retained entry) would never learn of
the topic. So the leader periodically writes a METADATA_SNAPSHOT entry: it
holds writes for a moment, waits until every entry in its log is applied,
then appends the state of every manager. The snapshot is thus exactly the
state as of the entry before it, and every replica adopts it as it applies
it: a replica with the whole history changes nothing, one whose log starts
later gains what it missed. Retention never deletes the latest snapshot.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

from store.config_manager import ConfigManager
from store.system_entry import SystemKind

log = logging.getLogger(__name__)


def capture_payload(managers: Sequence[ConfigManager]) -> Callable[[], dict[str, Any]]:
    """Every manager's state as of now; the payload is built when the
    returned function is called, which may be in a worker thread."""
    captures = {manager.file_name: manager.capture() for manager in managers if manager.in_metadata_snapshot}
    return lambda: {"managers": {name: capture() for name, capture in captures.items()}}


class MetadataSnapshotHandler:
    """Applies METADATA_SNAPSHOT entries to the managers, in log order."""

    kinds = frozenset({SystemKind.METADATA_SNAPSHOT})

    def __init__(self, managers: Sequence[ConfigManager]) -> None:
        self.managers = managers
        self.last_index = -1
        self.applied_at = time.monotonic()  # when this node last applied one (or started)
        # Managers whose state may lack entries this node never applied; only
        # these take a snapshot's state. The others already hold exactly it,
        # and decoding a big pop state anew (a million leases: 1.5 s) would
        # stall every node's event loop at every snapshot.
        self.incomplete: set[str] = set()

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
        self.last_index = max(self.last_index, index)
        self.applied_at = time.monotonic()
        states = payload.get("managers", {})
        for manager in self.managers:
            state = states.get(manager.file_name)
            if state is None or index <= manager.applied_index:
                continue  # not in this snapshot, or the manager's file is newer
            if manager.file_name in self.incomplete:
                manager.adopt(state)
                self.incomplete.discard(manager.file_name)
            manager.applied_index = index
