"""The chaos runs' repair check, read from node logs: a repairing node may
vote only for a candidate whose log reaches the log it had (its repair floor)."""
from __future__ import annotations

from pathlib import Path

from cluster.chaos.disk import repair_summary

START = ("ERROR dledger.server entry 5 is damaged on this node: cutting the log before it and repairing from "
         "the leader up to entry 20 (...)")
DONE = "INFO dledger.pusher.handler repair complete: entries up to 20 are on disk again; voting and counting again"


def vote(candidate_log: str, floor: str) -> str:
    return (f"INFO dledger.elector vote for n0 in term 9: ACCEPT (repairing: candidate log {candidate_log}, "
            f"repair floor {floor})")


def summarize(tmp_path: Path, *lines: str):  # noqa: ANN201
    (tmp_path / "n1.log").write_text("\n".join(lines) + "\n")
    return repair_summary(tmp_path)


def test_a_vote_for_a_log_reaching_the_floor_is_within_the_rule(tmp_path: Path):
    summary = summarize(tmp_path, START, vote("(3, 20)", "(3, 20)"), vote("(4, 2)", "(3, 20)"), DONE)
    assert (summary.repairs, summary.completed, summary.votes_while_repairing, summary.unsafe_repair_votes) \
        == (1, 1, 2, 0)


def test_a_vote_for_a_shorter_log_or_without_a_floor_is_unsafe(tmp_path: Path):
    summary = summarize(tmp_path, START, vote("(3, 19)", "(3, 20)"), vote("(9, 99)", "None"), DONE)
    assert summary.unsafe_repair_votes == 2


def test_a_plain_grant_while_repairing_is_unsafe_but_not_after_a_new_process(tmp_path: Path):
    plain = "INFO dledger.elector vote for n0 in term 9: ACCEPT"
    assert summarize(tmp_path, START, plain).unsafe_repair_votes == 1
    # A wipe ended the old repair: the new process found no currterm.
    restarted = "INFO dledger.member_state no /d/n1/dledger-n1/currterm: a new node, or one that lost its disk"
    assert summarize(tmp_path, START, restarted, plain).unsafe_repair_votes == 0
