"""A full disk never kills a node (issue 22, item 6): ENOSPC on any write of
the log, its checkpoint, its term file or the store's derived files makes
the node read-only (or makes the apply loop wait) and the node leaves that
state by itself once there is room again."""
from __future__ import annotations

import asyncio
import errno
import os
from collections import namedtuple

import pytest

from dledger.errors import DLedgerError, ResponseCode
from dledger.member_state import Role
from dledger.store import checkpoint as checkpoint_module
from dledger.store import file_store
from store.consume_queue import ConsumeQueue
from tests.unit.raft_harness import Cluster
from tests.unit.store_harness import StoreCluster, message

pytestmark = pytest.mark.timeout(60)

Usage = namedtuple("Usage", "total used free")


def enospc(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


async def eventually(condition, timeout: float = 5.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_enospc_in_the_checkpoint_makes_the_node_read_only_not_dead(tmp_path, monkeypatch):
    cluster = Cluster(str(tmp_path), checkpoint_interval_s=0.05)
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        server = cluster.servers[leader]
        await server.append([b"before"])
        real_write_temp = checkpoint_module.write_temp
        monkeypatch.setattr(checkpoint_module, "write_temp", lambda path, data: enospc() if server.store.base_dir in path
                            else real_write_temp(path, data))
        await eventually(lambda: bool(server.store.read_only_reason))
        checkpointer = next(t for t in server._tasks if t.get_name() == "Checkpointer")
        await asyncio.sleep(0.2)
        assert not checkpointer.done()
        # The read-only leader steps down; one of the others leads and takes appends.
        new = await cluster.wait_leader(among=[n for n in cluster.servers if n != leader])
        await cluster.servers[new].append([b"while the old leader's disk is full"])
        # Each checkpoint round first sees free bytes (clearing the state),
        # then fails its write again (setting it): look while it is set, with
        # no await in between (both happen on the event loop).
        await eventually(lambda: bool(server.store.read_only_reason))
        with pytest.raises(DLedgerError) as refused:
            server.store.append_as_leader([b"x"], term=server.member_state.term)
        assert refused.value.code is ResponseCode.DISK_FULL
        monkeypatch.undo()
        await eventually(lambda: not server.store.read_only_reason, timeout=15)
        # (Generous: the whole suite shares two cores with this cluster.)
        await cluster.wait_converged(timeout=15)
    finally:
        await cluster.stop()


async def test_a_node_that_cannot_persist_its_term_neither_votes_nor_dies(tmp_path, monkeypatch):
    cluster = Cluster(str(tmp_path))
    await cluster.start()
    try:
        leader = await cluster.wait_leader()
        victim = next(n for n in cluster.servers if n != leader)
        from dledger import member_state
        monkeypatch.setattr(member_state, "write_properties", enospc)
        # Every node's term file is unwritable now: no election can finish,
        # and no elector may die of it.
        await cluster.stop(leader)
        await asyncio.sleep(1.0)
        for node, server in cluster.servers.items():
            elector = next(t for t in server._tasks if t.get_name() == "DLedgerLeaderElector")
            assert not elector.done(), node
            assert server.member_state.role is not Role.LEADER, node
        monkeypatch.undo()
        new = await cluster.wait_leader(timeout=10)
        assert new in cluster.servers and victim in cluster.servers
    finally:
        await cluster.stop()


def test_the_disk_check_holds_read_only_until_the_failed_write_fits(tmp_path, monkeypatch):
    from tests.unit.test_file_store import open_store
    store = open_store(tmp_path)
    free = {"bytes": 1 << 30}
    monkeypatch.setattr(file_store.shutil, "disk_usage", lambda _path: Usage(10 << 30, 1 << 30, free["bytes"]))
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", enospc)
    with pytest.raises(DLedgerError) as full:
        store.append_as_leader([b"x" * 100], term=1)
    assert full.value.code is ResponseCode.DISK_FULL and store.read_only_reason
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    free["bytes"] = 1 << 20   # less than the margin: still read-only
    store.check_disk()
    assert store.read_only_reason
    free["bytes"] = 1 << 30
    store.check_disk()
    assert not store.read_only_reason
    store.append_as_leader([b"x" * 100], term=1)
    store.close()


def test_no_segment_is_created_without_room_for_it(tmp_path, monkeypatch):
    from tests.unit.test_file_store import DATA_FILE_SIZE, open_store
    store = open_store(tmp_path)
    store.append_as_leader([b"y" * 500], term=1)
    monkeypatch.setattr(file_store.shutil, "disk_usage", lambda _path: Usage(10 << 30, 1 << 30, DATA_FILE_SIZE // 2))
    with pytest.raises(DLedgerError) as full:
        for _ in range(20):   # fills the first segment, then needs a second
            store.append_as_leader([b"y" * 500], term=1)
    assert full.value.code is ResponseCode.DISK_FULL
    assert len(os.listdir(os.path.join(store.base_dir, "data"))) == 1
    store.close()


async def test_the_apply_loop_waits_out_a_full_disk_and_loses_nothing(tmp_path, monkeypatch):
    cluster = StoreCluster(str(tmp_path))
    await cluster.start()
    try:
        await cluster.create_topic("T", queues=1)
        leader = await cluster.wait_leader()
        victim = next(n for n in cluster.stores if n != leader)
        victim_store = cluster.stores[victim]
        real_put = ConsumeQueue.put_batch
        full = {"on": True}

        def put_batch(queue, first, units):  # noqa: ANN001
            if full["on"] and victim_store.consume_queues.find_or_create(queue.topic, queue.queue_id) is queue:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_put(queue, first, units)

        monkeypatch.setattr(ConsumeQueue, "put_batch", put_batch)
        store = cluster.stores[leader]
        await store.put_messages([message("T", b"m%d" % i) for i in range(10)])
        await eventually(lambda: bool(victim_store.reput.waiting_for_disk))
        await store.put_messages([message("T", b"m%d" % i) for i in range(10, 20)])
        await asyncio.sleep(0.3)
        assert victim_store.reput.failure is None
        full["on"] = False
        await cluster.wait_applied(timeout=10)
        for node, replica in cluster.stores.items():
            got = replica.get_messages("T", 0, 0, 100)
            assert [m.body for m in got.messages] == [b"m%d" % i for i in range(20)], node
    finally:
        await cluster.stop()
