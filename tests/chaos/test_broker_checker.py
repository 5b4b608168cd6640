"""The broker checker on hand-made histories and logs: a clean run with every
kind of message passes, and each promise broken on purpose is caught by its
own check (and only by it)."""
from __future__ import annotations

import zlib
from pathlib import Path

from cluster.chaos.broker_checker import BODY_PREFIX, GroupSpec, check_broker
from cluster.chaos.checker import LogEntry
from cluster.chaos.history import CheckBack, History, Operation, Outcome, SentMessage, load_history
from dledger.entry import MAGIC_NORMAL
from store import codec
from store.codec import MessageExt

WALL0 = 1_700_000_000_000   # the history's wall clock at time 0
GROUPS = [GroupSpec("G", ("Normal", "Delay", "Txn")), GroupSpec("F", ("Fifo",), fifo=True, max_attempts=3),
          GroupSpec("D", ("Normal",), max_attempts=3)]


class Run:
    """A history and a log built together."""

    def __init__(self) -> None:
        self.history = History(started_at=0.0, wall_started_ms=WALL0)
        self.rows: list[tuple[str, str, int, int, dict[str, str]]] = []
        self.offsets: dict[str, int] = {}

    def op(self, kind: str, uid: str, invoke: float, complete: float | None, outcome: Outcome = Outcome.OK,
           group: str = "", client: str = "p0") -> Operation:
        op = Operation(len(self.history.operations) + 1, client, (uid,), invoke, complete, outcome, kind=kind,
                       group=group)
        self.history.operations.append(op)
        return op

    def send(self, uid: str, topic: str, kind: str = "normal", at: float = 0.0, store: bool = True,
             outcome: Outcome = Outcome.OK, **sent: object) -> None:
        self.history.sent[uid] = SentMessage(uid, topic, kind, "p0", **sent)  # type: ignore[arg-type]
        self.op("send", uid, at, at + 0.01, outcome)
        if store:
            self.store(topic, uid, store_s=at)

    def store(self, topic: str, uid: str, store_s: float = 0.0, **properties: str) -> None:
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        self.rows.append((topic, uid, offset, WALL0 + int(store_s * 1000), properties))

    def deliver(self, group: str, uid: str, at: float, attempt: int = 1, invoked: float | None = None) -> None:
        invoked = at - 0.01 if invoked is None else invoked
        self.op("receive", "", invoked, at, group=group, client="c-" + group)
        self.history.delivered(group, "c-" + group, uid, "ID-" + uid, attempt, invoked)
        delivery = self.history.deliveries[-1]
        delivery.time_s, delivery.wall_ms = at, WALL0 + int(at * 1000)

    def ack(self, group: str, uid: str, at: float, outcome: Outcome = Outcome.OK) -> None:
        self.op("ack", uid, at, at + 0.01, outcome, group=group, client="c-" + group)

    def consume(self, group: str, uid: str, at: float) -> None:
        self.deliver(group, uid, at)
        self.ack(group, uid, at + 0.01)

    def log(self) -> list[LogEntry]:
        entries, chain = [], 0
        for index, (topic, uid, offset, store_ms, properties) in enumerate(self.rows):
            body = codec.encode(MessageExt(topic=topic, body=BODY_PREFIX + uid.encode() + b" x", queue_offset=offset,
                                           store_timestamp=store_ms, properties=properties))
            chain = zlib.crc32(body, chain)
            entries.append(LogEntry(index, 1, body, chain, MAGIC_NORMAL))
        return entries

    def check(self, states: dict[str, dict[str, str]] | None = None):
        log = self.log()
        return check_broker(self.history, {"n0": log, "n1": list(log)}, GROUPS, states)


def clean_run() -> Run:
    run = Run()
    run.send("n1", "Normal")
    run.consume("G", "n1", 0.1)
    run.consume("D", "n1", 0.2)
    # FIFO: m1 then m2, in order, each acked before the next.
    run.send("f1", "Fifo", "fifo", message_group="A")
    run.send("f2", "Fifo", "fifo", at=0.01, message_group="A")
    run.consume("F", "f1", 0.3)
    run.consume("F", "f2", 0.4)
    # Delayed, due at 2 s: stored in its topic and delivered after that.
    run.history.sent["d1"] = SentMessage("d1", "Delay", "delay", "p0", due_ms=WALL0 + 2000)
    run.op("send", "d1", 0.0, 0.01)
    run.store("Delay", "d1", store_s=2.005)
    run.consume("G", "d1", 2.05)
    # Transactions: one committed, one rolled back, one decided by a check-back.
    run.send("t1", "Txn", "txn", intent="commit", store=False)
    run.op("end", "t1", 0.1, 0.12)
    run.store("Txn", "t1", store_s=0.11)
    run.consume("G", "t1", 0.5)
    run.send("t2", "Txn", "txn", intent="rollback", store=False)
    run.op("end", "t2", 0.1, 0.12)
    run.send("t3", "Txn", "txn", intent="undecided", store=False)
    run.history.checks.append(CheckBack(6.0, "t3", "commit"))
    run.store("Txn", "t3", store_s=6.01)
    run.consume("G", "t3", 6.1)
    # Never acked by D: three attempts, then its dead-letter queue.
    run.send("x1", "Normal", never_ack=True)
    run.consume("G", "x1", 0.6)
    for attempt in (1, 2, 3):
        run.deliver("D", "x1", 1.0 + attempt, attempt)
    run.store("%DLQ%D", "x1", store_s=4.5, DLQ_ORIGIN_TOPIC="Normal")
    # A send whose answer was lost and which did not land: owed to nobody.
    run.send("u1", "Normal", outcome=Outcome.UNKNOWN, store=False)
    return run


def test_a_clean_run_passes_every_check():
    result = clean_run().check({"n0": {"cq/Normal/0": "a"}, "n1": {"cq/Normal/0": "a"}})
    assert result.valid, result.examples()
    assert result.dead_lettered == 1 and result.redeliveries == 2
    assert result.late_delayed["count"] == 1 and result.late_delayed["max_ms"] == 50


def only(result, name: str, expected: list[object]) -> None:
    assert getattr(result, name) == expected
    others = {k: v for k, v in result.counts().items() if v and k != name}
    assert others == {}, result.examples()


def test_an_acknowledged_send_nobody_received_is_lost():
    run = clean_run()
    run.send("n2", "Normal")
    result = run.check()
    assert result.lost == ["n2"] and ("n2", "G") in result.missed and ("n2", "D") in result.missed


def test_a_message_one_group_never_got_is_missed():
    run = clean_run()
    run.send("n2", "Normal")
    run.consume("G", "n2", 1.0)
    only(run.check(), "missed", [("n2", "D")])


def test_a_delivery_after_an_acknowledged_ack_is_counted():
    run = clean_run()
    run.deliver("G", "n1", 0.5, attempt=2)   # invoked 0.49, after the ack of 0.12
    only(run.check(), "redelivered_after_ack", [("G", "n1")])


def test_a_delivery_from_a_receive_invoked_before_the_ack_completed_is_allowed():
    run = clean_run()
    run.deliver("G", "n1", 0.5, attempt=2, invoked=0.1)
    assert run.check().valid


def test_one_message_stored_twice_is_a_duplicate_send():
    run = clean_run()
    run.store("Normal", "n1", store_s=0.02)   # a retry stored again
    only(run.check(), "duplicate_sends", ["n1"])


def test_a_fifo_message_delivered_before_the_earlier_one_was_acked_is_a_violation():
    run = clean_run()
    run.send("f3", "Fifo", "fifo", at=0.02, message_group="B")
    run.send("f4", "Fifo", "fifo", at=0.03, message_group="B")
    run.deliver("F", "f3", 0.5)
    run.deliver("F", "f4", 0.6)        # f3 not acked yet
    run.ack("F", "f3", 0.7)
    run.ack("F", "f4", 0.8)
    only(run.check(), "fifo_violations", [("F", "f4")])


def test_fifo_messages_of_one_group_in_one_batch_are_allowed():
    run = clean_run()
    run.send("f3", "Fifo", "fifo", at=0.02, message_group="B")
    run.send("f4", "Fifo", "fifo", at=0.03, message_group="B")
    run.deliver("F", "f3", 0.5, invoked=0.45)
    run.deliver("F", "f4", 0.5, invoked=0.45)   # the same receive's answer, in order
    run.ack("F", "f3", 0.6)
    run.ack("F", "f4", 0.6)
    assert run.check().valid, run.check().examples()


def test_a_fifo_message_after_a_dead_lettered_one_is_allowed():
    run = clean_run()
    run.send("f3", "Fifo", "fifo", at=0.02, message_group="B")
    run.send("f4", "Fifo", "fifo", at=0.03, message_group="B")
    for attempt in (1, 2, 3):
        run.deliver("F", "f3", 0.5 + attempt, attempt)
    run.store("%DLQ%F", "f3", store_s=4.0, DLQ_ORIGIN_TOPIC="Fifo")
    run.consume("F", "f4", 4.1)
    assert run.check().valid, run.check().examples()


def test_a_delayed_message_delivered_early_is_counted():
    run = clean_run()
    run.history.sent["d2"] = SentMessage("d2", "Delay", "delay", "p0", due_ms=WALL0 + 3000)
    run.op("send", "d2", 0.0, 0.01)
    run.store("Delay", "d2", store_s=3.0)
    run.consume("G", "d2", 2.9)          # delivered 100 ms early
    only(run.check(), "early_delayed", ["d2"])


def test_a_delayed_message_stored_in_its_topic_early_is_counted():
    run = clean_run()
    run.history.sent["d2"] = SentMessage("d2", "Delay", "delay", "p0", due_ms=WALL0 + 3000)
    run.op("send", "d2", 0.0, 0.01)
    run.store("Delay", "d2", store_s=2.5)
    run.consume("G", "d2", 3.1)
    only(run.check(), "early_delayed", ["d2"])


def test_a_rolled_back_transaction_in_its_topic_is_counted():
    run = clean_run()
    run.store("Txn", "t2", store_s=0.2)
    only(run.check(), "rolled_back_delivered", ["t2"])


def test_a_committed_transaction_missing_from_its_topic_is_lost():
    run = clean_run()
    run.send("t4", "Txn", "txn", intent="commit", store=False)
    run.op("end", "t4", 0.1, 0.12)
    only(run.check(), "committed_lost", ["t4"])


def test_a_check_back_after_an_acknowledged_end_is_wrong():
    run = clean_run()
    run.history.checks.append(CheckBack(5.0, "t1", "commit"))
    only(run.check(), "check_back_wrong", ["t1"])


def test_a_dead_letter_before_the_last_attempt_is_early():
    run = clean_run()
    run.send("x2", "Normal", never_ack=True)
    run.consume("G", "x2", 0.6)
    run.deliver("D", "x2", 1.0, 1)
    run.store("%DLQ%D", "x2", store_s=2.0, DLQ_ORIGIN_TOPIC="Normal")
    only(run.check(), "dlq_early", [("D", "x2")])


def test_an_acknowledged_message_in_the_dead_letter_queue_is_counted():
    run = clean_run()
    run.store("%DLQ%D", "n1", store_s=2.0, DLQ_ORIGIN_TOPIC="Normal")
    result = run.check()
    assert result.acked_in_dlq == [("D", "n1")]


def test_nodes_whose_derived_state_differs_are_reported():
    states = {"n0": {"cq/Normal/0": "a", "popState": "x"}, "n1": {"cq/Normal/0": "a", "popState": "y"},
              "n2": {"cq/Normal/0": "a"}}
    only(clean_run().check(states), "state_diverged", ["popState"])


def test_diverged_logs_are_reported():
    run = clean_run()
    log = run.log()
    other = list(log)
    other[0] = LogEntry(0, 2, log[0].body, log[0].chain_crc, MAGIC_NORMAL)
    result = check_broker(run.history, {"n0": log, "n1": other, "n2": list(log)}, GROUPS)
    assert [d.node for d in result.diverged] == ["n1"]


def test_the_history_file_round_trips(tmp_path: Path):
    run = clean_run()
    run.history.write(tmp_path / "history.jsonl")
    again = load_history(tmp_path / "history.jsonl")
    assert again.sent == run.history.sent and again.checks == run.history.checks
    assert sorted((d.uid, d.group, d.attempt, round(d.receive_invoke_s, 6)) for d in again.deliveries) == \
        sorted((d.uid, d.group, d.attempt, round(d.receive_invoke_s, 6)) for d in run.history.deliveries)
    assert sorted((o.number, o.kind, o.group, o.ids) for o in again.operations) == \
        [(o.number, o.kind, o.group, o.ids) for o in run.history.operations]
    assert check_broker(again, {"n0": run.log()}, GROUPS).valid
