"""Metadata snapshots hold writes only for the capture: the state is as of
an entry (asOf), entries keep landing while it is encoded, and a replica
that adopts the snapshot applies those entries exactly once."""
from __future__ import annotations

import asyncio
import os
import shutil
import threading
from typing import Any, Callable

import pytest

from store import message_store
from store.config_manager import ConfigManager
from store.message_store import MessageStore
from store.metadata_snapshot import MetadataSnapshotHandler, capture_payload, encode_snapshot, snapshot_as_of
from store.system_entry import SystemKind
from store.topic_config import TopicConfig
from tests.unit.store_harness import StoreCluster, message

COUNT_KIND = SystemKind.BROKER_BASE + 90


class CountingManager(ConfigManager):
    """Remembers every entry it applied, in order: an entry lost or applied
    twice shows, where the real managers' compare-and-set ops would hide a
    second application."""

    file_name = "counting.json"
    kinds = frozenset({COUNT_KIND})
    snapshot_on_change = False

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.seen: list[int] = []

    def apply_entry(self, kind: int, payload: dict[str, Any]) -> None:
        self.seen.append(int(payload["n"]))

    def encode(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}

    def decode(self, data: dict[str, Any]) -> None:
        self.seen = [int(n) for n in data["seen"]]


def counting(store: MessageStore) -> CountingManager:
    return next(m for m in store.managers if isinstance(m, CountingManager))


class BlockedEncoder:
    """Holds the snapshot's encoding (in its worker thread) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, payload: Callable[[], dict[str, Any]]) -> bytes:
        self.entered.set()
        self.release.wait(20)
        return encode_snapshot(payload)


async def no_periodic_snapshot(self: MessageStore) -> None:
    """Only the test's own snapshot: the adopting replica must adopt that one."""


@pytest.mark.parametrize("lost", ["disk", "store"])
async def test_entries_landing_while_a_snapshot_is_encoded_count_once_on_a_replica_that_adopts_it(
        tmp_path, monkeypatch, lost: str):
    monkeypatch.setattr(MessageStore, "_maybe_snapshot_metadata", no_periodic_snapshot)
    encoder = BlockedEncoder()
    monkeypatch.setattr(message_store, "encode_snapshot", encoder)
    c = StoreCluster(str(tmp_path), data_file_size=16 * 1024, max_entry_size=8 * 1024, retention_s=0.0,
                     retention_check_interval_s=0.2, store={"clean_interval_s": 0.2},
                     managers=lambda config_dir: [CountingManager(config_dir)])
    await c.start()
    try:
        store = await c.leader_store()
        n = 0

        async def count() -> int:
            nonlocal n
            n += 1
            return await store.append_system_entry(COUNT_KIND, {"n": n})

        for _ in range(3):
            await count()
        await store.commit_offsets([("G", "T", 0, 1)])
        await c.create_topic("T", queues=1)
        created_at = store.topics.applied_index
        for _ in range(12):
            await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])

        writing = asyncio.ensure_future(store.write_metadata_snapshot())
        assert await asyncio.to_thread(encoder.entered.wait, 10), "the snapshot was never encoded"
        # The state is captured; while it is encoded, writes of every kind
        # go on (with writes held, these would wait for the encoder).
        window = await asyncio.wait_for(count(), 5)
        await asyncio.wait_for(store.update_topic(TopicConfig("W", read_queue_nums=3, write_queue_nums=3)), 5)
        await asyncio.wait_for(store.commit_offsets([("G", "T", 0, 9), ("H", "W", 2, 4)]), 5)
        await asyncio.wait_for(store.put_messages([message("T", b"in the window")]), 5)
        for _ in range(2):
            last_in_window = await asyncio.wait_for(count(), 5)
        assert not writing.done()
        encoder.release.set()
        assert await writing
        snapshot_at, as_of = store.snapshots.last_index, store.snapshots.last_as_of
        assert created_at < as_of < window <= last_in_window < snapshot_at
        for _ in range(2):
            await count()
        await store.commit_offsets([("G", "T", 0, 11)])

        # Retention takes the entries that made T and the first counts, and
        # keeps everything after the snapshot's asOf, on the leader and on the
        # victim: each node runs its own retention on its own timer, and when
        # only the victim's store is lost its log must already be cut too (or
        # T would come back from the victim's own log, not the snapshot).
        leader = await c.wait_leader()
        victim = next(node for node in c.servers if node != leader)

        async def feed() -> None:
            await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])

        await c.wait_log_cut([leader, victim], past=created_at, feed=feed)
        for node in (leader, victim):
            begin = c.servers[node].store.ledger_begin_index
            assert begin <= as_of + 1, f"retention cut {node}'s log past the snapshot's asOf"

        await c.stop(victim)
        lost_dir = c.configs[victim].data_dir
        shutil.rmtree(lost_dir if lost == "disk" else os.path.join(lost_dir, "store"))
        await c.start(victim)
        await c.wait_applied(timeout=15)

        fresh = c.stores[victim]
        assert fresh.server.store.ledger_begin_index > created_at   # T is known only from the snapshot
        assert fresh.snapshots.incomplete == set()
        assert counting(store).seen == list(range(1, n + 1))
        for node, replica in c.stores.items():
            assert counting(replica).seen == list(range(1, n + 1)), node
            assert sorted(replica.topics.topics) == sorted(store.topics.topics), node
            assert replica.topics.get("W") is not None and replica.topics.get("W").write_queue_nums == 3, node
            assert replica.offsets.query("G", "T", 0) == 11 and replica.offsets.query("H", "W", 2) == 4, node
    finally:
        encoder.release.set()
        await c.stop()


class Recorder(CountingManager):
    pass


def test_a_snapshot_without_as_of_is_as_of_the_entry_before_it(tmp_path):
    replays: list[tuple[int, int]] = []
    manager = Recorder(str(tmp_path))
    manager.seen = [1, 2]
    payload = capture_payload([manager])()
    assert "asOf" not in payload and snapshot_as_of(7, payload) == 6
    replica = Recorder(str(tmp_path))
    handler = MetadataSnapshotHandler([replica], lambda first, last, _: replays.append((first, last)))
    handler.start(-1, log_lost_entries=True)
    handler.apply(7, SystemKind.METADATA_SNAPSHOT, payload)
    assert replica.seen == [1, 2] and replica.applied_index == 7
    assert replays == [] and handler.retention_floor() == 7


def test_an_adopting_manager_gets_the_entries_after_as_of_again_and_a_whole_one_does_not(tmp_path):
    source = Recorder(str(tmp_path))
    source.seen = [1, 2]
    payload = capture_payload([source], as_of=4)()
    replays: list[tuple[int, int, list[str]]] = []
    adopting, whole = Recorder(str(tmp_path)), Recorder(str(tmp_path))

    def replay(first: int, last: int, managers: Any) -> bool:
        replays.append((first, last, [m.file_name for m in managers]))
        for index in range(first, last + 1):
            for manager in managers:
                manager.apply(index, COUNT_KIND, {"n": index * 10})
        return True

    for replica, lost in ((adopting, True), (whole, False)):
        handler = MetadataSnapshotHandler([replica], replay)
        handler.start(3 if lost else -1, log_lost_entries=lost)
        replica.apply(5, COUNT_KIND, {"n": 50})   # applied before the snapshot, on the old state
        replica.apply(6, COUNT_KIND, {"n": 60})
        handler.apply(7, SystemKind.METADATA_SNAPSHOT, payload)
        assert handler.retention_floor() == 5 and replica.applied_index == 7
    assert adopting.seen == [1, 2, 50, 60] and whole.seen == [50, 60]
    assert replays == [(5, 6, ["counting.json"])]
    assert snapshot_as_of(7, {"asOf": 7}) == 6 and snapshot_as_of(7, {"asOf": "x"}) == 6


def test_a_replay_stopped_by_a_damaged_entry_leaves_the_manager_to_the_next_snapshot(tmp_path):
    source = Recorder(str(tmp_path))
    source.seen = [1, 2]
    first_payload = capture_payload([source], as_of=4)()
    source.seen = [1, 2, 3]
    second_payload = capture_payload([source], as_of=9)()
    replica = Recorder(str(tmp_path))
    handler = MetadataSnapshotHandler([replica], lambda first, last, managers: False)
    handler.start(3, log_lost_entries=True)
    handler.apply(7, SystemKind.METADATA_SNAPSHOT, first_payload)
    assert replica.seen == [1, 2] and handler.incomplete == {"counting.json"}
    handler.apply(10, SystemKind.METADATA_SNAPSHOT, second_payload)
    assert replica.seen == [1, 2, 3] and handler.incomplete == set() and replica.applied_index == 10
