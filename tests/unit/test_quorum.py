"""QuorumAckChecker: commit index from watermarks; Raft's figure-8 rule."""
from __future__ import annotations

import asyncio

import pytest

from dledger.errors import DLedgerError, ResponseCode
from dledger.pusher.dispatcher import Quota, next_compare_index
from dledger.pusher.quorum import PendingAppend, QuorumAckChecker, next_committed_index, quorum_index
from rpcgen import dledger_pb2 as pb


def test_quorum_index_is_the_majority_watermark():
    assert quorum_index([10, 7, 3], 2) == 7
    assert quorum_index([10, 7, 3, 2, 1], 3) == 3
    assert quorum_index([5], 1) == 5


def test_old_term_entry_is_not_committed_by_counting():
    # Figure 8: a leader of term 4 finds that a majority holds index 2, written
    # in term 2. Counting replicas must not commit it...
    terms = {0: 1, 1: 1, 2: 2, 3: 4}
    assert next_committed_index(1, [2, 2, 1], 2, term=4, term_at=terms.__getitem__) == 1
    # ...only once an entry of term 4 is on a majority, and then both commit.
    assert next_committed_index(1, [3, 3, 1], 2, term=4, term_at=terms.__getitem__) == 3


def test_commit_index_never_goes_back():
    assert next_committed_index(9, [5, 5, 5], 2, term=1, term_at=lambda i: 1) == 9


def test_watermarks_are_kept_per_term():
    q = QuorumAckChecker("n0", ["n0", "n1", "n2"], 2)
    q.start_term(3)
    assert q.update_watermark(3, "n1", 10)
    assert not q.update_watermark(3, "n1", 9)      # watermarks only rise
    assert not q.update_watermark(2, "n1", 20)     # answers for an old term are ignored
    q.update_watermark(3, "n0", 12)
    assert q.compute_committed(3, -1, lambda i: 3) == 10
    q.start_term(4)
    assert q.compute_committed(4, 10, lambda i: 4) == 10


async def test_pending_appends_complete_in_order_and_fail_on_term_change():
    q = QuorumAckChecker("n0", ["n0", "n1", "n2"], 2)
    loop = asyncio.get_running_loop()
    futures = []
    for first, last in [(0, 4), (5, 5), (6, 9)]:
        f = loop.create_future()
        futures.append(f)
        q.add_pending(PendingAppend(first, last, [], 0.0, 10.0, f))
    assert q.pending_entries() == 10
    assert q.complete_up_to(5) == 2
    assert futures[0].result()[:2] == (0, 4) and futures[1].done() and not futures[2].done()
    assert q.expire(now=5.0) == 0
    q.fail_all(ResponseCode.TERM_CHANGED, "lost")
    with pytest.raises(DLedgerError) as e:
        futures[2].result()
    assert e.value.code is ResponseCode.TERM_CHANGED
    assert q.pending_entries() == 0


async def test_pending_append_times_out():
    q = QuorumAckChecker("n0", ["n0", "n1", "n2"], 2)
    f = asyncio.get_running_loop().create_future()
    q.add_pending(PendingAppend(0, 0, [], 0.0, 2.5, f))
    assert q.expire(now=2.5) == 1
    with pytest.raises(DLedgerError) as e:
        f.result()
    assert e.value.code is ResponseCode.WAIT_QUORUM_ACK_TIMEOUT


def test_compare_backs_up_to_the_follower_end_or_before_the_conflicting_term():
    # Leader log terms by index: 0..3 term 1, 4..9 term 3.
    terms = [1, 1, 1, 1, 3, 3, 3, 3, 3, 3]
    term_at = lambda i: 0 if i < 0 else terms[i]  # noqa: E731
    shorter = pb.PushEntryResponse(ledger_end_index=4, conflict_term=-1, conflict_index=-1)
    assert next_compare_index(9, shorter, term_at, 0) == 4
    # The follower has term 2 from index 6 on; we have no term 2: jump before it.
    foreign = pb.PushEntryResponse(ledger_end_index=12, conflict_term=2, conflict_index=6)
    assert next_compare_index(9, foreign, term_at, 0) == 5
    # The follower has term 1 from index 0 up to 9; we have term 1 up to 3:
    # agreement is possible up to 3, never below the follower's committed prefix.
    shared = pb.PushEntryResponse(ledger_end_index=9, conflict_term=1, conflict_index=0)
    assert next_compare_index(9, shared, term_at, 0) == 3
    plain = pb.PushEntryResponse(ledger_end_index=12, conflict_term=-1, conflict_index=-1)
    assert next_compare_index(9, plain, term_at, 0) == 8


def test_quota_limits_bytes_per_second():
    quota = Quota(1000)
    assert quota.wait_time(100.0) == 0
    quota.spend(1000)
    assert quota.wait_time(100.4) == pytest.approx(0.6)
    assert quota.wait_time(101.0) == 0


async def test_a_commit_answers_log_appends_at_once_and_holds_the_state_machines_for_after_apply():
    q = QuorumAckChecker("n0", ["n0", "n1", "n2"], 2)
    loop = asyncio.get_running_loop()
    log_append, machine_append, later = loop.create_future(), loop.create_future(), loop.create_future()
    q.add_pending(PendingAppend(0, 0, [], 0.0, 10.0, log_append, after_apply=False))
    q.add_pending(PendingAppend(1, 1, [], 0.0, 10.0, machine_append))          # after_apply by default
    q.add_pending(PendingAppend(2, 2, [], 0.0, 10.0, later, after_apply=False))
    held: list[PendingAppend] = []
    assert q.complete_up_to(1, held) == 1
    assert log_append.done() and not machine_append.done() and not later.done()
    assert [p.first_index for p in held] == [1] and q.pending_entries() == 2
    assert q.complete(held) == 1
    assert machine_append.result()[:2] == (1, 1) and q.pending_entries() == 1
    assert q.complete_up_to(2) == 1 and later.done()                          # no `held`: all at once
