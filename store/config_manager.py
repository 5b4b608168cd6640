"""ConfigManager: state the apply loop derives from system entries, snapshotted
to a JSON file for a fast start (RocketMQ's ConfigManager: `topics.json` and
its `topics.json.bak`).

Each manager records the log index it has applied up to (`appliedIndex` in the
file, our addition to RocketMQ's format), so that after a restart the apply
loop can replay from further back without applying an entry twice.
"""
from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from dledger.store.properties import fsync_dir, write_temp
from store.errors import CorruptFileError

log = logging.getLogger(__name__)


Capture = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Snapshot:
    """A manager's state as of `applied_index`, captured on the event loop;
    `render` makes the file's bytes and may run in a worker thread."""
    capture: Capture
    applied_index: int
    indent: int | None

    def render(self) -> bytes:
        data = {**self.capture(), "appliedIndex": self.applied_index}
        separators = None if self.indent is not None else (",", ":")
        return json.dumps(data, indent=self.indent, separators=separators, sort_keys=True).encode("utf-8")


class ConfigManager(ABC):
    """Subclasses define `file_name`, `kinds`, `apply_entry`, `encode` and `decode`."""

    file_name = ""
    kinds: frozenset[int] = frozenset()
    # Whether the leader's metadata snapshots carry this state. False for
    # state derived from messages the log keeps anyway (pending timers, half
    # messages: a retention floor holds them), which may be too big for one entry.
    in_metadata_snapshot = True
    # Whether a change of this state makes a metadata snapshot due at once.
    # False for state that changes with every message (pop state, consumed
    # offsets): it rides along in the periodic snapshots, not one a second.
    snapshot_on_change = True
    # Files indented for people (RocketMQ's topics.json); None for state that
    # may hold a million items, which is written compact (json encodes an
    # indented file in Python, a compact one in C).
    indent: int | None = 2
    # 0o600 for state that holds secrets (users of the ACLs).
    file_mode = 0o644

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, self.file_name)
        self.applied_index = -1
        # The index of the entry apply_entry is applying (the pop state uses
        # it: its lease ids are entry indexes, the same on every replica).
        self.applying_index = -1
        # The last entry that changed this state (applied_index also moves
        # when a metadata snapshot is applied, which changes nothing here):
        # the leader compares it with the latest snapshot's asOf.
        self.changed_index = -1
        self._persisted_index = -1
        self.loaded = False            # whether load() found a file (or its .bak)

    # ------------------------------------------------------------- applying
    def apply(self, index: int, kind: int, payload: dict[str, Any]) -> None:
        """Apply a committed system entry, once: an index at or below
        applied_index is already in this state (a replay after restart)."""
        if index <= self.applied_index:
            return
        self.applying_index = index
        self.apply_entry(kind, payload)
        self.applied_index = self.changed_index = index

    @abstractmethod
    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        """Change the state as the entry says (`applying_index` is its index)."""

    # ---------------------------------------------------------------- files
    @abstractmethod
    def encode(self) -> dict[str, Any]:
        """The state as the JSON object of its file."""

    @abstractmethod
    def decode(self, data: dict[str, Any]) -> None:
        """Replace the state with the one a file holds."""

    @property
    def restoring(self) -> bool:
        """Whether a snapshot's state is still being decoded (see `adopt`):
        the state in memory is not yet what applied_index says."""
        return False

    def adopt(self, data: dict[str, Any]) -> None:
        """Take the state a metadata snapshot holds. A big state may build it
        in a worker thread, applying later entries once it is in (`restoring`
        meanwhile); this default decodes at once: right for small state."""
        self.decode(data)

    def load(self) -> None:
        """Read the file, or its .bak when the file is missing or unreadable."""
        for path in (self.path, self.path + ".bak"):
            if not os.path.exists(path):
                continue
            try:
                with open(path, encoding="utf-8") as file:
                    data = json.load(file)
                self.decode(data)
                self.applied_index = self._persisted_index = int(data.get("appliedIndex", -1))
                self.changed_index = self.applied_index
                self.loaded = True
                return
            except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
                log.warning("%s is unreadable (%s); trying the next copy", path, error)
        if os.path.exists(self.path) or os.path.exists(self.path + ".bak"):
            raise CorruptFileError(f"neither {self.path} nor its .bak can be read")

    def capture(self) -> Capture:
        """The state as of now, for encoding later, maybe in a worker thread.
        Runs on the event loop, so it must be cheap for a big state (a copy
        of its dicts, or a capture that journals later changes:
        store/captured_dict.py); what it returns must give the state as of
        now however the live state changes meanwhile. This default encodes at
        once: right for small state."""
        data = self.encode()
        return lambda: data

    def persist(self, force: bool = False) -> bool:
        """Write the file if anything was applied since the last write. Returns whether it wrote."""
        snapshot = self.snapshot(force)
        if snapshot is None:
            return False
        self.write(snapshot)
        return True

    def snapshot(self, force: bool = False) -> Snapshot | None:
        """The state to write and the index it covers, or None when nothing
        changed. Runs where the state changes (the event loop); `write` may
        then run in a worker thread."""
        if self.restoring or (self.applied_index == self._persisted_index and not force):
            return None
        return Snapshot(self.capture(), self.applied_index, self.indent)

    def write(self, snapshot: Snapshot) -> None:
        """Temp file, fsync, the old file becomes .bak, rename, fsync the directory."""
        text = snapshot.render()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = write_temp(self.path, text, self.file_mode)
        if os.path.exists(self.path):
            os.replace(self.path, self.path + ".bak")
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        self._persisted_index = snapshot.applied_index
