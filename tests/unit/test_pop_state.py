"""The pop state machine's rules and the leader's selection, without sockets:
leases, acks, expiry and redelivery, compare-and-set against stale
decisions, FIFO message groups, snapshots, receipt handles."""
from __future__ import annotations

import json
import os
import random
import zlib

import pytest

from broker.consumer import pop_state as pop_state_module
from broker.consumer.committer import ClaimTable
from broker.consumer.pop_state import (ATTEMPT, LEASE_ID, AckOp, ChangeOp, Lease, PopOp, PopQueue, PopStateManager,
                                       ResetOp, ops_payload, to_runs)
from broker.consumer.receipt import ReceiptHandle
from broker.consumer.selection import QueueClaims, Request, select
from broker.consumer.source import start_offset
from broker.errors import BrokerError
from broker.filter_expression import MATCH_ALL, parse_filter_expression
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from store import message_const as mc
from store.codec import MessageExt

G, T = "group", "topic"
NOW = 1_000_000


class ListSource:
    """A queue's messages in memory (selection.MessageSource)."""

    def __init__(self, messages: list[MessageExt]) -> None:
        self.messages = messages

    def read(self, offset: int) -> MessageExt | None:
        return self.messages[offset] if 0 <= offset < len(self.messages) else None

    def scan(self, start: int, max_count: int, tag_hashes: set[int] | None) -> tuple[list[MessageExt], int]:
        found = self.messages[start:start + max_count]
        return found, start + len(found)


def messages(count: int, tag: str | None = None, groups: list[str] | None = None) -> ListSource:
    result = []
    for offset in range(count):
        properties = {mc.UNIQ_KEY: f"id{offset}"}
        if tag is not None:
            properties[mc.TAGS] = tag if offset % 2 == 0 else "other"
        if groups is not None:
            properties[mc.MESSAGE_GROUP] = groups[offset]
        result.append(MessageExt(topic=T, body=b"m%d" % offset, queue_offset=offset, properties=properties))
    return ListSource(result)


def request(batch: int = 4, now: int = NOW, fifo: bool = False, max_attempts: int = 17, tags: str = "*") -> Request:
    return Request(G, T, 0, batch, now + 10_000, now, max_attempts, parse_filter_expression(pb.TAG, tags), fifo)


def apply(state: PopStateManager, index: int, *ops) -> None:
    state.apply(index, 100, ops_payload(list(ops)))


def pop(state: PopStateManager, index: int, source: ListSource, **kwargs) -> list[int]:
    """Decide and apply one receive; returns the offsets it delivered."""
    selection = select(request(**kwargs), state.queue(G, T, 0), 0, None, source)
    apply(state, index, selection.op)
    return [d.offset for d in selection.deliveries if (lease := state.lease_of(G, T, 0, d.offset))
            and lease.lease == index]


@pytest.fixture
def state(tmp_path) -> PopStateManager:
    return PopStateManager(str(tmp_path))


def test_a_receive_leases_new_messages_and_moves_the_frontier(state):
    assert pop(state, 10, messages(10)) == [0, 1, 2, 3]
    queue = state.queue(G, T, 0)
    assert queue.pop_offset == 4
    assert {o: (l[LEASE_ID], l[ATTEMPT]) for o, l in queue.in_flight.items()} == {o: (10, 1) for o in range(4)}
    assert pop(state, 11, messages(10)) == [4, 5, 6, 7]


def test_a_scan_that_does_not_start_at_the_frontier_delivers_nothing(state):
    apply(state, 10, PopOp(G, T, 0, NOW + 10_000, 0, 4, new=[0, 1, 2, 3]))
    # Decided on a view that had not seen entry 10: it starts at 0 again.
    apply(state, 11, PopOp(G, T, 0, NOW + 10_000, 0, 2, new=[0, 1]))
    queue = state.queue(G, T, 0)
    assert queue.pop_offset == 4 and all(lease[LEASE_ID] == 10 for lease in queue.in_flight.values())


def test_an_ack_ends_only_the_lease_it_names(state):
    pop(state, 10, messages(10))
    apply(state, 11, AckOp(G, T, 0, [(0, 10), (1, 99)]))
    assert sorted(state.queue(G, T, 0).in_flight) == [1, 2, 3]


def test_only_acks_that_can_unblock_messages_wake_waiting_receives(state, tmp_path):
    """The release listeners wake every long poll on the topic. Ending a
    concurrent lease makes no message deliverable, so an ack of one wakes
    nobody (the official clients ack one message a call: each wake-up was a
    scan of every queue by every waiting receive); ending a FIFO lease may
    unblock its message group, and a change of invisible duration moves a
    deadline: those wake."""
    woken: list[tuple[str, str]] = []
    state.release_listeners.append(lambda group, topic: woken.append((group, topic)))
    pop(state, 10, messages(10))
    apply(state, 11, AckOp(G, T, 0, [(0, 10), (1, 10)]))
    assert woken == [] and sorted(state.queue(G, T, 0).in_flight) == [2, 3]
    apply(state, 12, ChangeOp(G, T, 0, 2, 10, NOW))
    assert woken == [(G, T)]
    woken.clear()
    fifo = PopStateManager(str(tmp_path / "fifo"))
    fifo.release_listeners.append(lambda group, topic: woken.append((group, topic)))
    source = messages(4, groups=["a", "a", "b", "b"])
    assert pop(fifo, 10, source, fifo=True, batch=1) == [0]
    apply(fifo, 11, AckOp(G, T, 0, [(0, 10)]))
    assert woken == [(G, T)]
    assert pop(fifo, 12, source, fifo=True, batch=8) == [1, 2, 3]


def test_the_consumed_offset_is_the_lowest_unacked_message(state):
    pop(state, 10, messages(10))
    apply(state, 11, AckOp(G, T, 0, [(1, 10), (2, 10)]))
    assert state.queue(G, T, 0).consumed_offset() == 0
    apply(state, 12, AckOp(G, T, 0, [(0, 10), (3, 10)]))
    assert state.queue(G, T, 0).consumed_offset() == 4


def test_an_expired_lease_is_delivered_again_with_the_attempt_raised_and_a_new_lease(state):
    source = messages(2)
    assert pop(state, 10, source, batch=1) == [0]
    assert pop(state, 11, source, batch=1) == [1]          # offset 0 still invisible
    later = NOW + 10_001
    assert pop(state, 12, source, batch=1, now=later) == [0]
    lease = state.lease_of(G, T, 0, 0)
    assert (lease.lease, lease.attempt) == (12, 2)
    apply(state, 13, AckOp(G, T, 0, [(0, 10)]))             # the first delivery's handle no longer counts
    assert state.lease_of(G, T, 0, 0) is not None


def test_expired_leases_come_back_longest_expired_first(state):
    source = messages(20)
    assert pop(state, 10, source, now=NOW) == [0, 1, 2, 3]               # invisible until NOW + 10 s
    assert pop(state, 11, source, now=NOW - 5_000) == [4, 5, 6, 7]       # until NOW + 5 s
    later = NOW + 20_000
    assert pop(state, 12, source, now=later) == [4, 5, 6, 7]
    assert pop(state, 13, source, now=later) == [0, 1, 2, 3]
    assert pop(state, 14, source, now=later) == [8, 9, 10, 11]


def test_a_redelivery_decided_before_an_ack_was_applied_does_not_bring_the_message_back(state):
    source = messages(1)
    pop(state, 10, source)
    stale = select(request(now=NOW + 10_001), state.queue(G, T, 0), 0, None, source)
    assert [d.offset for d in stale.deliveries] == [0]
    apply(state, 11, AckOp(G, T, 0, [(0, 10)]))
    apply(state, 12, stale.op)
    assert state.queue(G, T, 0).in_flight == {}


def test_a_message_out_of_attempts_is_left_for_the_dead_letter_queue(state):
    source = messages(1)
    pop(state, 10, source)
    assert pop(state, 11, source, now=NOW + 10_001, max_attempts=2) == [0]
    assert pop(state, 12, source, now=NOW + 30_000, max_attempts=2) == []
    lease = state.lease_of(G, T, 0, 0)
    apply(state, 13, AckOp(G, T, 0, [(0, lease.lease)], dead=True))
    assert state.queue(G, T, 0).consumed_offset() == 1


def test_a_change_moves_the_deadline_under_a_new_lease(state):
    source = messages(1)
    pop(state, 10, source)
    apply(state, 11, ChangeOp(G, T, 0, 0, 10, NOW))          # nack: visible at once
    assert state.lease_of(G, T, 0, 0).lease == 11
    apply(state, 12, ChangeOp(G, T, 0, 0, 10, NOW + 50_000))  # the old handle: refused
    assert state.lease_of(G, T, 0, 0).deadline_ms == NOW
    assert pop(state, 13, source, now=NOW) == [0]
    assert state.lease_of(G, T, 0, 0).attempt == 2


def test_tag_mismatches_are_skipped_for_good(state):
    source = messages(8, tag="a")
    assert pop(state, 10, source, tags="a", batch=8) == [0, 2, 4, 6]
    queue = state.queue(G, T, 0)
    assert queue.pop_offset == 8 and sorted(queue.in_flight) == [0, 2, 4, 6]
    apply(state, 11, AckOp(G, T, 0, [(o, 10) for o in (0, 2, 4, 6)]))
    assert queue.consumed_offset() == 8


def test_claims_keep_a_concurrent_receive_off_the_messages_of_one_in_flight(state):
    source = messages(10)
    claims = ClaimTable()
    first = select(request(), None, 0, None, source)
    claims.hold((G, T, 0), first.op.end, [d.offset for d in first.deliveries], [])
    second = select(request(), None, 0, claims.get((G, T, 0)), source)
    assert [d.offset for d in second.deliveries] == [4, 5, 6, 7]
    apply(state, 10, first.op)
    apply(state, 11, second.op)
    assert sorted(state.queue(G, T, 0).in_flight) == list(range(8))
    claims.release((G, T, 0), first.op.end, [d.offset for d in first.deliveries], [])
    assert claims.get((G, T, 0)) is None  # nothing pending: the applied frontier rules again


def test_a_receive_that_followed_a_lost_first_receive_does_not_skip_its_messages(state):
    source = messages(10)
    claims = ClaimTable()
    lost = select(request(), None, 0, None, source)        # the group's first receive: its entry is lost
    claims.hold((G, T, 0), lost.op.end, [d.offset for d in lost.deliveries], [])
    follower = select(request(), None, 0, claims.get((G, T, 0)), source)
    apply(state, 10, follower.op)
    queue = state.queue(G, T, 0)
    assert (queue.pop_offset, queue.in_flight) == (0, {})
    assert pop(state, 11, source) == [0, 1, 2, 3]


def test_after_a_failed_append_the_next_receive_starts_at_the_applied_frontier(state):
    source = messages(10)
    claims = ClaimTable()
    lost = select(request(), None, 0, None, source)
    claims.hold((G, T, 0), lost.op.end, [d.offset for d in lost.deliveries], [])
    claims.release((G, T, 0), lost.op.end, [d.offset for d in lost.deliveries], [])   # its append failed
    assert pop(state, 10, source) == [0, 1, 2, 3]


def test_a_reset_starts_the_queue_over(state):
    pop(state, 10, messages(10))
    apply(state, 11, ResetOp(G, T, 0, 2))
    queue = state.queue(G, T, 0)
    assert (queue.pop_offset, queue.in_flight) == (2, {})
    assert pop(state, 12, messages(10)) == [2, 3, 4, 5]


def test_an_entry_applied_again_after_a_restart_changes_nothing(state):
    pop(state, 10, messages(10))
    apply(state, 11, AckOp(G, T, 0, [(0, 10)]))
    before = state.encode()
    apply(state, 10, PopOp(G, T, 0, NOW + 10_000, 4, 8, new=[4, 5, 6, 7]))
    assert state.encode() == before


def test_the_snapshot_restores_leases_deadlines_and_blocked_messages(state, tmp_path):
    pop(state, 10, messages(6, groups=["a", "a", "b", "b", "a", "c"]), fifo=True, batch=1)
    pop(state, 11, messages(6, groups=["a", "a", "b", "b", "a", "c"]), fifo=True, batch=2)
    state.persist(force=True)
    restored = PopStateManager(str(tmp_path))
    restored.load()
    assert restored.encode() == state.encode() and restored.applied_index == 11
    assert restored.next_deadline(G, T) == state.next_deadline(G, T)
    assert restored.queue(G, T, 0).blocked == state.queue(G, T, 0).blocked != {}


def test_a_capture_holds_the_state_as_of_its_capture(state):
    # The encoding runs in a worker thread while the apply loop goes on.
    pop(state, 10, messages(10))
    expected = state.encode()
    capture = state.capture()
    apply(state, 11, AckOp(G, T, 0, [(0, 10), (1, 10)]))
    pop(state, 12, messages(10))
    apply(state, 13, ResetOp(G, T, 1, 7))
    assert capture() == expected != state.encode()


def test_a_snapshot_taken_on_the_event_loop_encodes_nothing_until_it_is_rendered(state, monkeypatch):
    # Encoding runs in the writer's thread: on the loop a million leases took 2.3 s.
    pop(state, 10, messages(10))
    packed = []
    monkeypatch.setattr(pop_state_module, "pack_ints", lambda values, delta=False: packed.append(len(values)) or "")
    snapshot = state.snapshot(force=True)
    assert packed == []
    snapshot.render()
    assert packed == [4, 4, 4, 4]


def test_a_file_with_one_row_per_lease_still_loads(tmp_path):
    # popState.json as written before leases were packed in columns.
    old = {"appliedIndex": 12, "popQueues": [
        {"group": G, "topic": T, "queue": 0, "popOffset": 4, "blocked": [[5, "b"]],
         "inFlight": [[0, 10, NOW + 5_000, 1, "a"], [3, 12, NOW + 9_000, 2, None]]}]}
    (tmp_path / "popState.json").write_text(json.dumps(old))
    state = PopStateManager(str(tmp_path))
    state.load()
    queue = state.queue(G, T, 0)
    assert queue.in_flight == {0: Lease(10, NOW + 5_000, 1, "a"), 3: Lease(12, NOW + 9_000, 2, None)}
    assert queue.blocked == {5: "b"} and state.next_deadline(G, T) == NOW + 5_000 and state.applied_index == 12


def test_a_large_pop_state_is_small_on_disk_and_comes_back_whole(tmp_path):
    # 200,000 leases in flight: as one JSON row each the file was about 6.5
    # MB, more than a log entry may hold, so the metadata snapshot carrying
    # it could not be written.
    state = PopStateManager(str(tmp_path))
    rng = random.Random(3)
    leases = {}
    lease, deadline = 1_000, NOW
    for offset in range(200_000):
        if offset % 32 == 0:
            lease, deadline = lease + rng.randint(1, 50), deadline + rng.randint(0, 20)
        leases[offset] = Lease(lease, deadline, 1 if rng.random() < 0.9 else rng.randint(2, 16), None)
    queue = PopQueue(200_000)
    queue.restore(leases)
    state._set_queue((G, T, 0), queue)
    state.applied_index = 99
    state.persist()
    assert os.path.getsize(state.path) < 512 * 1024
    restored = PopStateManager(str(tmp_path))
    restored.load()
    assert restored.queue(G, T, 0).in_flight == leases
    assert restored.next_deadline(G, T) == min(lease.deadline_ms for lease in leases.values())
    assert restored.encode() == state.encode()


def test_replicas_applying_the_same_entries_agree(tmp_path):
    rng = random.Random(7)
    replicas = [PopStateManager(str(tmp_path / name)) for name in "abc"]
    source = messages(200)
    leader = replicas[0]
    for index in range(1, 300):
        now = NOW + index * 1000
        choice = rng.random()
        queue = leader.queue(G, T, 0)
        if choice < 0.5 or queue is None:
            ops = [select(request(batch=rng.randint(1, 8), now=now), queue, 0, None, source).op]
        elif choice < 0.9:
            leases = rng.sample(sorted(queue.in_flight.items()), min(3, len(queue.in_flight)))
            ops = [AckOp(G, T, 0, [(o, l[LEASE_ID] if rng.random() < 0.9 else 0) for o, l in leases])]
        else:
            ops = [ChangeOp(G, T, 0, o, l[LEASE_ID], now) for o, l in list(queue.in_flight.items())[:2]]
        for replica in replicas:
            apply(replica, index, *ops)
    assert replicas[0].encode() == replicas[1].encode() == replicas[2].encode()
    assert replicas[0].queue(G, T, 0).pop_offset > 0


# -------------------------------------------------------------------- FIFO


def test_fifo_holds_a_message_group_with_a_live_lease_and_blocks_the_messages_behind(state):
    source = messages(6, groups=["a", "a", "b", "a", "c", "b"])
    assert pop(state, 10, source, fifo=True, batch=1) == [0]
    # a is in flight: its later messages wait, b and c go.
    assert pop(state, 11, source, fifo=True, batch=8) == [2, 4, 5]
    queue = state.queue(G, T, 0)
    assert queue.blocked == {1: "a", 3: "a"} and queue.pop_offset == 6
    assert pop(state, 12, source, fifo=True, batch=8) == []
    apply(state, 13, AckOp(G, T, 0, [(0, 10)]))
    assert pop(state, 14, source, fifo=True, batch=8) == [1, 3]
    assert queue.blocked == {}


def test_fifo_redelivers_an_expired_message_before_the_ones_behind_it(state):
    source = messages(3, groups=["a", "a", "a"])
    assert pop(state, 10, source, fifo=True, batch=1) == [0]
    assert pop(state, 11, source, fifo=True, batch=8) == []
    later = NOW + 10_001
    assert pop(state, 12, source, fifo=True, batch=1, now=later) == [0]
    assert state.lease_of(G, T, 0, 0).attempt == 2
    apply(state, 13, AckOp(G, T, 0, [(0, 12)]))
    assert pop(state, 14, source, fifo=True, batch=8, now=later) == [1, 2]


def test_fifo_keeps_a_message_group_waiting_while_its_expired_message_awaits_the_dead_letter_queue(state):
    source = messages(2, groups=["a", "a"])
    pop(state, 10, source, fifo=True, batch=1, max_attempts=1)
    assert pop(state, 11, source, fifo=True, batch=8, now=NOW + 10_001, max_attempts=1) == []
    lease = state.lease_of(G, T, 0, 0)
    apply(state, 12, AckOp(G, T, 0, [(0, lease.lease)], dead=True))
    assert pop(state, 13, source, fifo=True, batch=8, now=NOW + 10_001, max_attempts=1) == [1]


def test_fifo_claims_hold_the_groups_of_a_receive_in_flight(state):
    source = messages(4, groups=["a", "b", "a", "b"])
    claims = QueueClaims(frontier=2, scans=1, offsets={0}, )
    claims.groups.update(["a"])
    second = select(request(fifo=True, batch=8), None, 0, claims, source)
    assert [d.offset for d in second.deliveries] == [3]
    assert second.op.blocked == [(2, "a")]


@pytest.mark.parametrize("committed, first, end, start", [
    (None, 0, 50, 0),      # nothing deleted yet: from the first message
    (None, 20, 50, 50),    # retention deleted some: from the end
    (7, 0, 50, 7),         # a committed offset (a pull consumer's, a reset) wins
])
def test_a_new_group_starts_at_the_first_message_until_retention_deleted_some(committed, first, end, start):
    assert start_offset(committed, first, end) == start


# ------------------------------------------------------------ receipt handles


def test_a_receipt_handle_round_trips_for_its_group_and_topic():
    handle = ReceiptHandle(3, 1234, 99, NOW)
    assert ReceiptHandle.decode(handle.encode(G, T), G, T) == handle


def test_a_receipt_handle_issued_before_the_cached_check_is_still_accepted():
    # Handles made by one CRC over group, topic and body (as before the
    # group and topic's CRC was cached) stay good across an upgrade.
    body = f"1:{3:x}:{1234:x}:{99:x}:{NOW:x}"
    check = zlib.crc32("\x00".join((G, T, body)).encode())
    old = f"{body}:{check:08x}"
    assert ReceiptHandle(3, 1234, 99, NOW).encode(G, T) == old
    assert ReceiptHandle.decode(old, G, T) == ReceiptHandle(3, 1234, 99, NOW)


@pytest.mark.parametrize("text", ["", "garbage", "1:0:0:0:0", "2:0:0:0:0:0", "1:zz:0:0:0:0", "x" * 1000])
def test_a_malformed_receipt_handle_is_refused(text):
    with pytest.raises(BrokerError) as refused:
        ReceiptHandle.decode(text, G, T)
    assert refused.value.code == pb.INVALID_RECEIPT_HANDLE


@pytest.mark.parametrize("group, topic", [("other", T), (G, "other")])
def test_a_receipt_handle_of_another_group_or_topic_is_refused(group, topic):
    text = ReceiptHandle(0, 1, 2, NOW).encode(G, T)
    with pytest.raises(BrokerError) as refused:
        ReceiptHandle.decode(text, group, topic)
    assert refused.value.code == pb.INVALID_RECEIPT_HANDLE and "not issued" in refused.value.message


def test_stale_heap_entries_are_compacted():
    queue = PopQueue(0)
    from broker.consumer.pop_state import Lease
    for i in range(5000):
        queue.grant(i, Lease(i, NOW + i, 1))
        queue.release(i, i)
    assert len(queue._deadlines) <= 1024 + 2
    assert queue.next_deadline() is None and MATCH_ALL.matches_all


# ---------------------------------------------------------- filter changes


def tagged(*tags: str, groups: list[str] | None = None) -> ListSource:
    return ListSource([MessageExt(topic=T, body=b"m%d" % offset, queue_offset=offset,
                                  properties={mc.UNIQ_KEY: f"id{offset}", mc.TAGS: tag,
                                              **({mc.MESSAGE_GROUP: groups[offset]} if groups else {})})
                       for offset, tag in enumerate(tags)])


@pytest.mark.parametrize("fifo", [False, True])
def test_an_expired_lease_whose_message_no_longer_matches_the_filter_is_filtered_out(state, fifo):
    # Received with *, never acked, then the group subscribes to TagA only:
    # the TagB leases used to be skipped for good, never dead-lettered, and
    # held the group's consumed offset at 0 forever.
    source = tagged("TagB", "TagB", "TagB", "TagA", groups=["g1", "g2", "g3", "g4"] if fifo else None)
    assert pop(state, 10, source, batch=3, fifo=fifo) == [0, 1, 2]
    later = NOW + 10_001
    assert pop(state, 11, source, batch=8, now=later, tags="TagA", fifo=fifo) == [3]
    queue = state.queue(G, T, 0)
    assert sorted(queue.in_flight) == [3] and queue.consumed_offset() == 3
    assert state.lease_end(G, T, 0, 0, 10).how == "filtered"
    # A lease still running is the consumer's: it is not taken away.
    assert pop(state, 12, source, batch=8, now=later, tags="TagB", fifo=fifo) == []
    assert sorted(queue.in_flight) == [3]


def test_filtered_out_leases_are_bounded_per_receive(state, monkeypatch):
    from broker.consumer import selection
    monkeypatch.setattr(selection, "FILTERED_PER_RECEIVE", 4)
    source = tagged(*["TagB"] * 10)
    assert pop(state, 10, source, batch=10) == list(range(10))
    assert pop(state, 11, source, batch=8, now=NOW + 10_001, tags="TagA") == []
    assert len(state.queue(G, T, 0).in_flight) == 6


def test_receive_attempt_ids_survive_a_restart_from_the_snapshot(state, tmp_path):
    # They were neither in popState.json nor in metadata snapshots: a node
    # restarted from its file answered a retried receive with nothing.
    selection = select(Request(G, T, 0, 2, NOW + 10_000, NOW, 17, MATCH_ALL, attempt_id="a1"), None, 0, None,
                       messages(4))
    apply(state, 10, selection.op)
    state.persist(force=True)
    restarted = PopStateManager(str(tmp_path))
    restarted.load()
    assert restarted.recent_receive(G, "a1") == state.recent_receive(G, "a1") is not None
    assert restarted.encode() == state.encode()


def test_receive_attempt_ids_are_kept_as_runs_of_offsets(state, tmp_path):
    # Every state file holds the last 10,000 of them: written as (queue,
    # offset) pairs, 32-message receives cost each node 560-780 ms and 3.7 MB
    # per write. A batch of consecutive offsets is now one run.
    assert to_runs([(0, 5), (0, 6), (0, 7), (1, 7), (1, 9), (0, 8)]) == ((0, 5, 3), (1, 7, 1), (1, 9, 1), (0, 8, 1))
    selection = select(Request(G, T, 0, 32, NOW + 10_000, NOW, 17, MATCH_ALL, attempt_id="a1"), None, 0, None,
                       messages(40))
    apply(state, 10, selection.op)
    recent = state.recent_receive(G, "a1")
    assert recent.runs == ((0, 0, 32),) and recent.offsets == [(0, k) for k in range(32)]
    assert state.encode()["recentReceives"] == [[G, "a1", 10, T, ((0, 0, 32),)]]
    state.persist(force=True)
    with open(state.path, encoding="utf-8") as file:
        assert json.load(file)["recentReceives"] == [[G, "a1", 10, T, [[0, 0, 32]]]]


def test_a_state_file_with_attempt_offsets_as_pairs_still_loads(state, tmp_path):
    selection = select(Request(G, T, 0, 3, NOW + 10_000, NOW, 17, MATCH_ALL, attempt_id="a1"), None, 0, None,
                       messages(4))
    apply(state, 10, selection.op)
    state.persist(force=True)
    with open(state.path, encoding="utf-8") as file:
        data = json.load(file)
    data["recentReceives"] = [[G, "a1", 10, T, [[0, 0], [0, 1], [0, 2]]]]   # as files were written before runs
    with open(state.path, "w", encoding="utf-8") as file:
        json.dump(data, file)
    restarted = PopStateManager(str(tmp_path))
    restarted.load()
    assert restarted.recent_receive(G, "a1") == state.recent_receive(G, "a1")
    assert restarted.recent_receive(G, "a1").offsets == [(0, 0), (0, 1), (0, 2)]


# ------------------------------------------------------- metadata snapshots


async def test_a_replica_lacking_the_state_decodes_a_snapshot_off_the_event_loop(tmp_path):
    # Decoding a million leases took a replica's loop 1-3 s; now a worker
    # thread builds the state while ops after the snapshot wait in order, and
    # the result equals applying the snapshot and the ops on the loop.
    from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload
    leader = PopStateManager(str(tmp_path / "leader"))
    pop(leader, 10, messages(10))
    leader.queue(G, T, 0).restore({o: Lease(10, NOW + o, 1) for o in range(50_000)})
    payload = capture_payload([leader])()
    replica = PopStateManager(str(tmp_path / "replica"))
    handler = MetadataSnapshotHandler([replica])
    handler.start(-1, log_lost_entries=True)
    handler.apply(11, 200, payload)
    assert replica.restoring                       # the decode runs in a thread
    ack = AckOp(G, T, 0, [(0, 10), (1, 10)])
    for manager in (leader, replica):
        apply(manager, 12, ack)                     # waits for the decode on the replica
    assert replica.snapshot(force=True) is None     # no file claims what is not installed yet
    await replica.restored()
    assert not replica.restoring and replica.applied_index == 12
    assert replica.encode() == leader.encode()


def test_lease_offsets_sorted_by_slices_are_in_order_whatever_the_insertion_order():
    import random

    from store.slices import SLICE, sorted_in_slices
    rising = list(range(3 * SLICE + 5))
    assert sorted_in_slices(rising) == rising
    shuffled = list(range(2 * SLICE + 7))
    random.Random(7).shuffle(shuffled)
    resent = [*range(100, 2 * SLICE), 3, 1]   # old offsets re-granted last
    for keys in (shuffled, resent, []):
        assert sorted_in_slices(keys) == sorted(keys)


async def test_a_replica_adopting_a_snapshot_as_of_an_earlier_entry_gets_the_ops_after_it_once(tmp_path):
    # The leader captured its state as of entry 10 and appended the snapshot
    # at 13; the acks at 11 and 12 landed meanwhile. A replica that adopts it
    # (in a worker thread) must apply them again after the state as of 10,
    # in order, before the ops after the snapshot.
    from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload
    leader = PopStateManager(str(tmp_path / "leader"))
    pop(leader, 10, messages(10))
    leader.queue(G, T, 0).restore({o: Lease(10, NOW + o, 1) for o in range(50_000)})
    payload = capture_payload([leader], as_of=10)()
    log = {11: AckOp(G, T, 0, [(0, 10), (1, 10)]), 12: AckOp(G, T, 0, [(5, 10)])}
    replica = PopStateManager(str(tmp_path / "replica"))

    def replay(first: int, last: int, managers) -> bool:
        for index in range(first, last + 1):
            for manager in managers:
                apply(manager, index, log[index])
        return True

    handler = MetadataSnapshotHandler([replica], replay)
    handler.start(-1, log_lost_entries=True)
    for index, op in log.items():
        apply(leader, index, op)
        apply(replica, index, op)            # on the state it had before (none)
    handler.apply(13, 200, payload)
    assert replica.restoring
    for manager in (leader, replica):
        apply(manager, 14, AckOp(G, T, 0, [(7, 10)]))
    await replica.restored()
    assert replica.applied_index == 14 and replica.lease_of(G, T, 0, 0) is None
    assert replica.encode() == leader.encode()


def test_leases_in_flight_are_rows_the_garbage_collector_leaves_alone(state, tmp_path):
    # A full collection runs on the event loop and walks every object it
    # tracks: a million leases in flight as objects held the leader's
    # heartbeats for each one. Rows of ints and strs are untracked once looked at.
    import gc
    apply(state, 10, PopOp(G, T, 0, NOW + 10_000, 0, 1000, new=list(range(1000)),
                           new_groups=[f"g{i % 7}" for i in range(1000)]))
    apply(state, 11, ChangeOp(G, T, 0, 5, 10, NOW + 20_000))
    state.persist(force=True)
    loaded = PopStateManager(str(tmp_path))
    loaded.load()
    gc.collect()
    for manager in (state, loaded):
        queue = manager.queue(G, T, 0)
        assert len(queue.in_flight) == 1000 and queue.in_flight[5] == (11, NOW + 20_000, 1, "g5")
        assert not gc.is_tracked(queue.in_flight)
        assert not any(gc.is_tracked(row) for row in queue.in_flight.values())
    assert state.lease_of(G, T, 0, 5).deadline_ms == NOW + 20_000
