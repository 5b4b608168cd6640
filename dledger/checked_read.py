"""Reading entries back from this node's own log for a state machine, each
one checked before it is handed out.

An entry is CRC-checked when it enters the log; after that it sits on a disk
that may flip a bit while the node is stopped or running. Whatever derives
state from entries read back from disk (the store's apply loop, the message
id table rebuilt at start, a metadata snapshot's re-application) reads them
through a CheckedReader: every entry's CRCs, header and chain link are
checked, as the scrubber checks them, and the first damaged one is cut and
repaired from the leader (DLedgerServer.repair_damage) instead of applied.
A 10-minute broker chaos run showed why: a flipped bit in a transaction's
commit, applied, left its half message undecided, and a later leader's
check-back committed it a second time.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, NamedTuple

from dledger.entry import verified_prefix
from dledger.errors import CorruptLogError

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

log = logging.getLogger(__name__)

REPAIR_POLL_S = 0.05


class CheckedRun(NamedTuple):
    data: bytes
    count: int            # entries from the run's start that passed their checks
    damaged: int | None   # the first entry that did not, now being repaired


class CheckedReader:
    """Runs of checked entries from one node's log. It remembers the chain
    CRC where its last run ended, so reading on from there costs no read of
    the previous entry's header (the apply loop reads run after run)."""

    def __init__(self, server: DLedgerServer) -> None:
        self.server = server
        self._chain = (-2, 0)   # (index, chain CRC after it)
        self._repairing: int | None = None   # a damaged entry read_repaired waits for

    def read(self, start: int, max_bytes: int, max_count: int) -> CheckedRun:
        """Up to max_count entries from `start` (at least one, if any),
        checked. A damaged entry is cut from the log with everything after
        it and fetched again from the leader: the run ends before it."""
        data, count = self.server.store.read_raw(start, max_bytes, max_count)
        if count == 0:
            return CheckedRun(data, 0, None)
        good, damaged = self._verified(data, start, count)
        if good == count:
            return CheckedRun(data, good, None)
        self.server.repair_damage(damaged)
        return CheckedRun(data, good, damaged)

    async def read_repaired(self, start: int, max_bytes: int, max_count: int) -> tuple[bytes, int]:
        """As read, but a damaged entry is waited for until its repair has
        brought it back (for readers that may wait: the id table's rebuild).
        (b"", 0) past the log's end."""
        while True:
            if self._repairing is not None and start >= self._repairing:
                await self._repaired(self._repairing)
                self._repairing = None
            run = self.read(start, max_bytes, max_count)
            self._repairing = run.damaged
            if run.count or run.damaged is None:
                return run.data, run.count

    async def _repaired(self, index: int) -> None:
        store = self.server.store
        if store.ledger_end_index < index:
            log.warning("entry %d is being repaired from the leader: reading on once it is back", index)
        while store.ledger_end_index < index:
            await asyncio.sleep(REPAIR_POLL_S)

    def _verified(self, data: bytes, start: int, count: int) -> tuple[int, int]:
        """How many of the run's entries pass their checks, and the first
        damaged entry (the one before the run when its header is what fails)."""
        at, chain = self._chain
        if at != start - 1:
            try:
                chain = self.server.store.chain_crc_at(start - 1)
            except CorruptLogError:
                return 0, start - 1
        good, after = verified_prefix(data, start, count, chain)
        if good:
            # Committed entries are the same on every replica, so a repair
            # never changes the chain up to here.
            self._chain = (start + good - 1, after)
        return good, start + good
