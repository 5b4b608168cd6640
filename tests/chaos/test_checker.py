"""The checker on hand-made histories and logs: every kind of violation is
caught, and a clean history (with the outcomes a real run produces: unknown
appends that landed and that did not, failed ones, NOOP entries) passes."""
from __future__ import annotations

import zlib
from pathlib import Path

from cluster.chaos.checker import LogEntry, check
from cluster.chaos.history import FaultWindow, History, Operation, Outcome, load_history
from cluster.chaos.schedule import ISOLATE_LEADER
from cluster.chaos.workload import body_for
from dledger.entry import MAGIC_NOOP, MAGIC_NORMAL, MAGIC_PRODUCER_MARK
from store.system_entry import SystemKind, encode_system_entry


def op(number: int, ids: list[str], invoke: float, complete: float | None, outcome: Outcome,
       first_index: int | None = None, client: str = "c0") -> Operation:
    return Operation(number, client, tuple(ids), invoke, complete, outcome, first_index)


def build_log(items: list[tuple[int, bytes] | tuple[int, bytes, int]]) -> list[LogEntry]:
    """Entries from index 0 with the given (term, body[, magic]), chained like
    the store's chain CRC; an empty body is a NOOP."""
    entries, chain = [], 0
    for index, (term, body, *rest) in enumerate(items):
        magic = rest[0] if rest else (MAGIC_NOOP if body == b"" else MAGIC_NORMAL)
        chain = zlib.crc32(body, zlib.crc32(f"{index}:{term}:{magic}".encode(), chain))
        entries.append(LogEntry(index, term, body, chain, magic))
    return entries


def body(op_id: str) -> bytes:
    return body_for(op_id, 32)


def clean_history() -> History:
    history = History(started_at=0.0)
    history.operations = [
        op(1, ["c0-0"], 0.0, 0.1, Outcome.OK, 1),
        op(2, ["c1-0", "c1-1"], 0.05, 0.2, Outcome.OK, 2),     # a batch: indexes 2 and 3
        op(3, ["c0-1"], 0.3, 1.3, Outcome.UNKNOWN),             # landed at 5, after a new leader's NOOP
        op(4, ["c1-2"], 0.35, 1.0, Outcome.UNKNOWN),            # did not land
        op(5, ["c2-0"], 0.4, 0.45, Outcome.FAIL),               # NOT_LEADER: never landed
        op(6, ["c2-1"], 1.5, 1.6, Outcome.OK, 6),
    ]
    return history


def clean_log() -> list[LogEntry]:
    # Ends with a producer mark: the log's own entry, which carries no workload id.
    return build_log([(1, b""), (1, body("c0-0")), (1, body("c1-0")), (1, body("c1-1")),
                      (2, b""), (2, body("c0-1")), (2, body("c2-1")), (2, b"\x00mark", MAGIC_PRODUCER_MARK)])


def three_copies(log: list[LogEntry]) -> dict[str, list[LogEntry]]:
    return {"n0": list(log), "n1": list(log), "n2": list(log)}


def test_clean_history_passes_every_check():
    result = check(clean_history(), three_copies(clean_log()))
    assert result.valid, result.counts()
    assert result.unknown_present == 1
    assert result.committed_entries == 8


def test_acknowledged_entry_missing_from_the_log_is_lost():
    log = [e for e in clean_log() if e.body != body("c1-1")]
    log = build_log([(e.term, e.body, e.magic) for e in log])
    result = check(clean_history(), three_copies(log))
    assert result.lost == ["c1-1"]
    assert not result.valid


def test_acknowledged_entry_at_another_index_than_acknowledged_is_misplaced():
    history = clean_history()
    history.operations[5].first_index = 5  # the client was told 5; the log has it at 6
    log = build_log([(1, b""), (1, body("c0-0")), (1, body("c1-0")), (1, body("c1-1")),
                     (2, b""), (2, b""), (2, body("c2-1"))])
    result = check(history, three_copies(log))
    assert result.misplaced == ["c2-1"]
    assert not result.valid


def test_id_in_two_entries_is_duplicated():
    items = [(e.term, e.body, e.magic) for e in clean_log()] + [(2, body("c0-1"))]  # the unknown append, twice
    result = check(clean_history(), three_copies(build_log(items)))
    assert result.duplicated == ["c0-1"]
    assert not result.valid


def test_acknowledged_entry_duplicated_is_caught_too():
    items = [(e.term, e.body, e.magic) for e in clean_log()] + [(2, body("c0-0"))]
    result = check(clean_history(), three_copies(build_log(items)))
    assert result.duplicated == ["c0-0"]


def test_committed_entry_that_differs_on_one_node_is_a_divergence():
    logs = three_copies(clean_log())
    tampered = list(logs["n2"])
    entry = tampered[3]
    tampered[3] = LogEntry(entry.index, entry.term, body("c9-9"), entry.chain_crc)
    logs["n2"] = tampered
    result = check(clean_history(), logs)
    assert [(d.node, d.index, d.what) for d in result.diverged] == [("n2", 3, "body")]
    assert not result.valid


def test_same_body_with_a_different_term_or_chain_is_a_divergence():
    logs = three_copies(clean_log())
    e = logs["n1"][5]
    logs["n1"][5] = LogEntry(e.index, e.term + 1, e.body, e.chain_crc)
    e = logs["n2"][6]
    logs["n2"][6] = LogEntry(e.index, e.term, e.body, e.chain_crc ^ 1)
    result = check(clean_history(), logs)
    assert sorted((d.node, d.index, d.what) for d in result.diverged) == [("n1", 5, "term"), ("n2", 6, "chain_crc")]


def test_entry_of_another_kind_at_the_same_index_is_a_divergence():
    logs = three_copies(clean_log())
    e = logs["n0"][4]
    logs["n0"][4] = LogEntry(e.index, e.term, e.body, e.chain_crc, MAGIC_NORMAL)   # the NOOP, as a client entry
    result = check(clean_history(), logs)
    assert ("n0", 4, "magic") in [(d.node, d.index, d.what) for d in result.diverged]


def test_hole_in_a_committed_log_is_a_divergence():
    logs = three_copies(clean_log())
    del logs["n1"][4]
    result = check(clean_history(), logs)
    assert ("n1", 4, "hole in the committed log") in [(d.node, d.index, d.what) for d in result.diverged]


def test_shorter_but_identical_log_does_not_diverge():
    logs = three_copies(clean_log())
    logs["n2"] = logs["n2"][:5]
    assert check(clean_history(), logs).diverged == []


def test_append_acknowledged_before_another_was_invoked_must_have_the_lower_index():
    history = History(started_at=0.0)
    history.operations = [
        op(1, ["c0-0"], 0.0, 1.0, Outcome.OK, 2),   # acknowledged at t=1 with index 2
        op(2, ["c1-0"], 1.5, 2.0, Outcome.OK, 1),   # invoked at t=1.5, yet at index 1
    ]
    log = build_log([(1, b""), (1, body("c1-0")), (1, body("c0-0"))])
    result = check(history, three_copies(log))
    assert [(v.earlier_op, v.later_op) for v in result.order_violations] == [(1, 2)]
    assert not result.valid


def test_concurrent_appends_may_land_in_either_order():
    history = History(started_at=0.0)
    history.operations = [
        op(1, ["c0-0"], 0.0, 1.0, Outcome.OK, 2),
        op(2, ["c1-0"], 0.5, 2.0, Outcome.OK, 1),   # invoked before op 1 was acknowledged
    ]
    log = build_log([(1, b""), (1, body("c1-0")), (1, body("c0-0"))])
    assert check(history, three_copies(log)).valid


def test_unknown_append_that_landed_below_an_earlier_acknowledgement_is_an_order_violation():
    history = History(started_at=0.0)
    history.operations = [
        op(1, ["c0-0"], 0.0, 1.0, Outcome.OK, 2),
        op(2, ["c1-0"], 1.5, 3.0, Outcome.UNKNOWN),   # found at index 1
    ]
    log = build_log([(1, b""), (1, body("c1-0")), (1, body("c0-0"))])
    assert len(check(history, three_copies(log)).order_violations) == 1


def test_entry_no_client_sent_is_unexpected():
    items = [(e.term, e.body, e.magic) for e in clean_log()]
    items += [(2, b"garbage"), (2, body("c7-7"))]  # not a workload body; an id never invoked
    result = check(clean_history(), three_copies(build_log(items)))
    assert result.unexpected == [8, 9]
    assert not result.valid


def test_metadata_entries_the_store_writes_itself_are_not_unexpected():
    snapshot = encode_system_entry(SystemKind.METADATA_SNAPSHOT, {"managers": {}})
    items = [(e.term, e.body, e.magic) for e in clean_log()] + [(2, snapshot), (2, snapshot[:-1] + b"!")]
    result = check(clean_history(), three_copies(build_log(items)))
    assert result.system_entries == 1
    assert result.unexpected == [9]   # a damaged one is not the store's


def test_append_that_was_refused_must_not_be_in_the_log():
    items = [(e.term, e.body, e.magic) for e in clean_log()] + [(2, body("c2-0"))]
    result = check(clean_history(), three_copies(build_log(items)))
    assert result.failed_present == ["c2-0"]
    assert not result.valid


def isolation_history(ack_at: float) -> History:
    history = History(started_at=0.0)
    history.faults = [FaultWindow(1, ISOLATE_LEADER, ("n0",), 1.0, 3.0)]
    history.operations = [op(1, ["probe-1"], 1.1, ack_at, Outcome.OK, 1, client="probe-n0")]
    return history


def test_isolated_old_leader_acknowledging_before_the_heal_is_caught():
    log = build_log([(1, b""), (1, body("probe-1"))])
    result = check(isolation_history(ack_at=2.0), three_copies(log))
    assert result.stale_leader_acks == [1]
    assert not result.valid


def test_old_leader_acknowledging_after_the_heal_is_fine():
    log = build_log([(1, b""), (1, body("probe-1"))])
    assert check(isolation_history(ack_at=3.5), three_copies(log)).valid


def test_history_file_round_trip_gives_the_same_verdict(tmp_path: Path):
    history = clean_history()
    history.faults = [FaultWindow(1, "kill-leader", ("n1",), 0.2, 0.9, "", group=1)]
    history.write(tmp_path / "history.jsonl")
    loaded = load_history(tmp_path / "history.jsonl")
    assert [(o.number, o.ids, o.outcome, o.first_index) for o in loaded.operations] == \
           [(o.number, o.ids, o.outcome, o.first_index) for o in history.operations]
    assert loaded.faults == history.faults
    items = [(e.term, e.body, e.magic) for e in clean_log() if e.body != body("c0-0")]
    assert check(loaded, three_copies(build_log(items))).lost == ["c0-0"]
