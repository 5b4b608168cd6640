"""The log's checkpoint: where recovery may start, and what it must not cut.

The `checkpoint` file (Java properties, as DLedger's) records the committed
index, the flushed end and the log's begin. It is always replaced whole
(temp file, fsync, rename, fsync the directory: dledger/store/properties.py).

Checkpoints are written from two places: on the event loop (truncate, reset,
retention, close) and, for the periodic one, in the store's flush thread from
state captured on the loop. A capture that a truncate or reset overtook must
never land: it would point into entries that no longer exist, and the node
would refuse to restart. `CheckpointFile` decides that with a generation
number, bumped under a lock by every write on the loop and by every cut; a
checkpoint finished in the thread is renamed into place only if the
generation it was captured at is still current.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from dledger.errors import CorruptLogError
from dledger.store.properties import fsync_dir, properties_text, read_properties, write_properties, write_temp

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    """What the `checkpoint` file records. end_index is the flushed end (its
    entry is on disk), flushed_position where the entry after it starts (for an
    empty log: where entry begin_index will go)."""
    begin_index: int = 0
    end_index: int = -1
    committed_index: int = -1
    flushed_position: int = 0
    before_begin_term: int = 0
    before_begin_chain_crc: int = 0

    def to_properties(self) -> dict[str, str]:
        return {
            "committedIndex": str(self.committed_index),
            "endIndex": str(self.end_index),
            "flushedPosition": str(self.flushed_position),
            "beginIndex": str(self.begin_index),
            "beforeBeginTerm": str(self.before_begin_term),
            "beforeBeginChainCrc": str(self.before_begin_chain_crc),
        }

    @classmethod
    def from_properties(cls, values: dict[str, str]) -> "Checkpoint":
        def number(key: str, default: int) -> int:
            return int(values[key]) if key in values else default
        return cls(begin_index=number("beginIndex", 0), end_index=number("endIndex", -1),
                   committed_index=number("committedIndex", -1),
                   flushed_position=number("flushedPosition", 0),
                   before_begin_term=number("beforeBeginTerm", 0),
                   before_begin_chain_crc=number("beforeBeginChainCrc", 0))


class CheckpointFile:
    """The checkpoint file and the generation that keeps stale writes out."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._generation = 0
        # The end index of the checkpoint on disk (-1: none, or not known to
        # point anywhere that matters): a cut below it must rewrite it.
        self.end_index = -1

    def read(self) -> Checkpoint | None:
        """The checkpoint on disk; None when there is none or it cannot be
        trusted to say where to start (recovery then scans the whole log)."""
        if not os.path.exists(self.path):
            return None
        values = read_properties(self.path)
        if "beginIndex" not in values:
            # DLedger 0.3's checkpoint (endIndex, committedIndex only): a full
            # scan from the start is the safe reading of it.
            log.warning("checkpoint %s has no beginIndex; scanning the whole log", self.path)
            return None
        try:
            return Checkpoint.from_properties(values)
        except ValueError as e:
            raise CorruptLogError(f"checkpoint {self.path} is unreadable: {e}") from e

    def write(self, checkpoint: Checkpoint) -> None:
        """Here and now (the event loop): any checkpoint still being written
        in the flush thread from before becomes stale and will not replace it."""
        with self._lock:
            self._generation += 1
            write_properties(self.path, checkpoint.to_properties())
            self.end_index = checkpoint.end_index

    @property
    def generation(self) -> int:
        """Taken with the state a background checkpoint captures."""
        return self._generation

    def persist(self, checkpoint: Checkpoint, generation: int) -> bool:
        """The flush thread: write a checkpoint captured at `generation`;
        False (and nothing replaced) when a write or a cut since made it stale."""
        tmp = write_temp(self.path, properties_text(checkpoint.to_properties()))
        with self._lock:
            if generation != self._generation:
                os.unlink(tmp)
                return False
            os.replace(tmp, self.path)
            # Under the lock: a cut either sees this end or makes this
            # checkpoint stale before it is put in place.
            self.end_index = checkpoint.end_index
        fsync_dir(os.path.dirname(self.path))
        return True

    def invalidate(self, last_kept_index: int) -> bool:
        """The log is cut after `last_kept_index` (truncate, reset): every
        checkpoint in flight is stale. True when the one on disk points past
        the cut, so that the caller must rewrite (or remove) it."""
        with self._lock:
            self._generation += 1
            return self.end_index > last_kept_index

    def remove(self) -> None:
        """When it cannot be rewritten: without one, recovery scans the log
        from its first segment, which is slow but never wrong."""
        with self._lock:
            self._generation += 1
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.end_index = -1
        log.warning("removed the checkpoint %s, which could not be rewritten: the next start scans "
                    "the whole log", self.path)
