"""Recovery's verdict on where the start-up scan stopped (dledger/store/recovery.py
`judge`), as a table: no files, no store. A bad entry past everything the node
flushed and committed is a torn tail (cut it); at or below that point, or
followed by a valid entry, or a log shorter than the checkpoint says, it is
damage to data the node may have acknowledged."""
from __future__ import annotations

import pytest

from dledger.errors import CorruptLogError
from dledger.store.checkpoint import Checkpoint
from dledger.store.recovery import ScanResult, judge

# Entries 0..9 committed and flushed; entry 9 ends at pos 1000.
CHECKPOINT = Checkpoint(begin_index=0, end_index=9, committed_index=9, flushed_position=1000)


def scan(last_index: int | None, end_offset: int, failure: str = "", damaged: bool = False,
         first_index: int | None = 10) -> ScanResult:
    return ScanResult(end_offset=end_offset, last_index=last_index, last_term=1, last_chain_crc=0,
                      first_index=first_index, failure=failure, damaged=damaged)


@pytest.mark.parametrize("result, checkpoint, torn, damaged_at", [
    # A clean end at or past the flushed point: nothing to say.
    (scan(12, 1300), CHECKPOINT, "", -1),
    # A bad entry after the flushed, committed end: a write cut short.
    (scan(12, 1300, failure="body CRC"), CHECKPOINT, "body CRC", -1),
    # The same bad entry with a valid one after it: written whole, then damaged.
    (scan(12, 1300, failure="body CRC", damaged=True), CHECKPOINT, "", 13),
    # A bad entry at or below the committed index.
    (scan(7, 800, failure="chain CRC", first_index=0), CHECKPOINT, "", 8),
    # A clean end short of what the checkpoint says is committed and flushed.
    (scan(8, 900, first_index=0), CHECKPOINT, "", 9),
    # No checkpoint: nothing was promised, every bad tail is torn.
    (scan(3, 400, failure="bad magic 7", first_index=0), None, "bad magic 7", -1),
])
def test_a_stop_past_the_flushed_point_is_torn_and_one_below_it_is_damage(result, checkpoint, torn, damaged_at):
    verdict = judge(result, checkpoint, from_log_start=False)
    assert verdict.torn_tail == torn
    assert verdict.damaged_index == damaged_at
    assert (verdict.damage is not None) == (damaged_at >= 0)
    assert verdict.end_index == result.last_index


def test_the_damage_message_says_why_the_entry_counts_as_acknowledged():
    below = judge(scan(7, 800, failure="chain CRC", first_index=0), CHECKPOINT, from_log_start=False)
    assert "below the committed/flushed point" in below.damage.message
    followed = judge(scan(12, 1300, failure="body CRC", damaged=True), CHECKPOINT, from_log_start=False)
    assert "written whole and then damaged" in followed.damage.message


def test_a_log_that_starts_after_the_checkpoints_begin_is_refused():
    with pytest.raises(CorruptLogError, match="entries are missing"):
        judge(scan(12, 1300, first_index=3), CHECKPOINT, from_log_start=True)


def test_an_empty_log_without_a_checkpoint_begins_at_zero_and_ends_before_it():
    verdict = judge(scan(None, 0, first_index=None), None, from_log_start=True)
    assert (verdict.begin_index, verdict.end_index, verdict.damage) == (0, -1, None)
