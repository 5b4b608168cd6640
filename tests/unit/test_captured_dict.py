"""A capture of a big lease table begun on the event loop and copied later in
a worker thread, while the loop goes on changing the table
(store/captured_dict.py, PopQueue.begin_capture): the copy holds the table
exactly as of the capture's beginning."""
from __future__ import annotations

import asyncio
import gc
import random
import threading


from broker.consumer.pop_state import Lease, PopQueue, PopStateManager
from store import captured_dict
from store.captured_dict import DictCapture


class InterleavingDict(dict):
    """Runs `between` at every read the copy makes, as if the event loop ran
    between the worker's reads (the worst case: between every key)."""

    between = staticmethod(lambda: None)
    inside = False

    def get(self, key, default=None):  # noqa: ANN001, ANN201 - dict.get's signature
        if not self.inside:          # the owner's own reads (before_change) run nothing
            self.inside = True
            self.between()
            self.inside = False
        return super().get(key, default)


def test_a_copy_made_while_the_dict_changes_holds_the_dict_as_of_the_capture(monkeypatch):
    monkeypatch.setattr(captured_dict, "SLICE", 7)
    rng = random.Random(11)
    live = InterleavingDict({k: f"v{k}" for k in range(200)})
    expected = dict(live)
    capture = DictCapture(live)

    def change() -> None:   # what the owner does on the loop: journal, then change
        key = rng.randrange(300)
        capture.before_change(key)
        if rng.random() < 0.4:
            live.pop(key, None)
        else:
            dict.__setitem__(live, key, f"new{rng.random()}")

    live.between = change
    for _ in range(50):
        change()            # changes before the copy begins, too
    assert live != expected
    keys, values = capture.sorted_items()
    assert dict(zip(keys, values)) == expected and keys == sorted(expected)
    assert capture.finished


def test_a_lease_table_copied_in_a_worker_while_the_loop_acks_and_grants_is_exact():
    async def scenario() -> None:
        state = PopStateManager("/nonexistent")
        queue = state._set_queue(("g", "t", 0), PopQueue(0))
        queue.restore({o: Lease(1, 1_000 + o, 1) for o in range(300_000)})
        for offset in range(0, 300_000, 3):
            queue.block(offset + 300_000, "mg") if offset % 30 == 0 else None
        queue.pop_offset = 600_000
        expected = state.encode()
        capture = state.capture()
        encoding = asyncio.ensure_future(asyncio.to_thread(capture))
        changes, lease_id = 0, 2
        while not encoding.done():   # the loop changes the table while the worker copies it
            for offset in range(changes * 97 % 300_000, 300_000, 50_000):
                queue.release(offset, queue.in_flight[offset].lease) if offset in queue.in_flight else \
                    queue.grant(offset, Lease(lease_id, 5, 2))
                queue.unblock(offset + 300_000)
                lease_id += 1
            changes += 1
            await asyncio.sleep(0)
        assert await encoding == expected
        assert changes > 3, "the worker finished before the loop changed anything"
        assert state.encode() != expected
        queue.grant(7, Lease(lease_id, 5, 2))
        queue.block(7, "mg")
        assert not queue._lease_captures and not queue._blocked_captures   # copied: no more journalling

    asyncio.run(scenario())


def test_a_capture_dropped_without_a_copy_stops_journalling():
    queue = PopQueue(0)
    queue.restore({o: Lease(1, 1, 1) for o in range(10)})
    capture = queue.begin_capture()
    queue.release(3, 1)
    assert 3 in capture.in_flight.journal
    del capture
    gc.collect()
    queue.release(4, 1)
    assert not queue._lease_captures


def test_two_captures_at_once_each_hold_their_own_moment():
    queue = PopQueue(0)
    queue.restore({o: Lease(1, 1, 1) for o in range(10)})
    first = queue.begin_capture()
    queue.release(0, 1)
    second = queue.begin_capture()
    queue.grant(0, Lease(2, 2, 2))
    queue.release(1, 1)
    copied = {}

    def copy_second() -> None:
        _, offsets, leases, _ = second.read()
        copied["second"] = dict(zip(offsets, leases))

    thread = threading.Thread(target=copy_second)
    thread.start()
    thread.join()
    assert dict(zip(*first.read()[1:3])) == {o: Lease(1, 1, 1) for o in range(10)}
    assert copied["second"] == {o: Lease(1, 1, 1) for o in range(1, 10)}
    assert queue.in_flight == {0: Lease(2, 2, 2), **{o: Lease(1, 1, 1) for o in range(2, 10)}}
