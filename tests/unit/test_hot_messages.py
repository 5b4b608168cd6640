"""The leader's hot messages (store/hot_messages.py): a message read back from
memory is exactly what decoding it from the log gives, only committed messages
are held, the bound holds, and a caller that changes what it read changes
nothing for the next reader."""
from __future__ import annotations

import dataclasses
import os

import pytest

from store import codec
from store import message_const as mc
from store.codec import MessageExt
from store.hot_messages import HotMessages
from store.socket_address import SocketAddress
from tests.unit.store_harness import StoreCluster, message

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path):
    c = StoreCluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


def decoded_from_log(store, physical_offset: int) -> MessageExt:
    return codec.decode(store.commit_log.read(physical_offset), crc_checked=True)


def assert_same(held: MessageExt, decoded: MessageExt) -> None:
    # Equality leaves out store_size and body_crc: compared here as well.
    assert held == decoded
    assert (held.store_size, held.body_crc) == (decoded.store_size, decoded.body_crc)
    assert type(held.body) is bytes and type(held.topic) is str


def varied() -> list[MessageExt]:
    plain = message("Hot", b"plain", tags="A", keys="k1 k2", uniq_key="U1")
    empty_value = message("Hot", b"", queue_id=1)
    empty_value.properties["EMPTY"] = ""
    v6 = message("Hot", bytearray(b"from an IPv6 producer"), queue_id=2)
    v6.born_host = SocketAddress("::1", 7777)
    prepared = message("Hot", b"half", queue_id=3)
    prepared.sys_flag = mc.TRANSACTION_PREPARED_TYPE
    prepared.properties[mc.TRANSACTION_PREPARED] = "true"
    long_topic = message("L" * 200, b"a V2 record (topic over 127 bytes)")
    unicode_props = message("Hot", "ünïcode body".encode(), tags="tägs", keys="ключ")
    return [plain, empty_value, v6, prepared, long_topic, unicode_props]


async def test_a_message_read_from_the_hot_messages_is_what_the_log_decodes_to(cluster: StoreCluster):
    await cluster.create_topic("Hot", queues=4)
    await cluster.create_topic("L" * 200, queues=1)
    store = await cluster.leader_store()
    results = await store.put_messages(varied())
    hot = store.commit_log.hot
    assert len(hot) == len(results)
    for result in results:
        held = store.read_message(result.physical_offset, result.size)
        assert_same(held, decoded_from_log(store, result.physical_offset))
    assert hot.hits == len(results) and hot.misses == 0
    # A pull through the ConsumeQueue reads them from memory too.
    await cluster.wait_applied()
    pulled = store.get_messages("Hot", 0, 0, 10).messages
    assert [m.body for m in pulled] == [b"plain", "ünïcode body".encode()]
    assert hot.hits == len(results) + 2


async def test_followers_hold_nothing_and_read_the_same_messages_from_their_logs(cluster: StoreCluster):
    await cluster.create_topic("Hot", queues=4)
    leader = await cluster.leader_store()
    results = await leader.put_messages([message("Hot", b"m%d" % i, queue_id=i % 4) for i in range(8)])
    await cluster.wait_applied()
    for store in cluster.stores.values():
        if store is leader:
            continue
        assert len(store.commit_log.hot) == 0
        for result in results:
            assert_same(leader.read_message(result.physical_offset), store.read_message(result.physical_offset))


async def test_a_caller_that_changes_what_it_read_changes_nothing_held(cluster: StoreCluster):
    await cluster.create_topic("Hot", queues=1)
    store = await cluster.leader_store()
    [result] = await store.put_messages([message("Hot", b"x", tags="A")])
    first = store.read_message(result.physical_offset)
    first.properties["TAGS"] = "changed"
    first.queue_offset = 99
    again = store.read_message(result.physical_offset)
    assert again.tags == "A" and again.queue_offset == 0
    assert_same(again, decoded_from_log(store, result.physical_offset))


async def test_a_message_not_committed_is_not_held(tmp_path):
    c = StoreCluster(str(tmp_path), max_wait_ack_s=0.3)
    await c.start()
    try:
        await c.create_topic("Hot", queues=1)
        leader_id = await c.wait_leader()
        store = c.stores[leader_id]
        for node in [n for n in c.stores if n != leader_id]:
            await c.stop(node)     # no quorum: the put cannot commit
        with pytest.raises(Exception):
            await store.put_messages([message("Hot", b"never committed")])
        assert len(store.commit_log.hot) == 0
        # Nor left for the apply loop to take (test_written_messages.py):
        # whatever the put left in the log is parsed.
        assert store.commit_log.written == {}
    finally:
        await c.stop()


def test_the_oldest_go_first_once_the_bound_is_reached():
    records = []
    hot = HotMessages(capacity_bytes=1000)
    for i in range(10):
        m = dataclasses.replace(message("T", bytes(150)), physical_offset=48 + 400 * i,
                                born_host=SocketAddress("127.0.0.1", 1))
        record = codec.encode(m)
        records.append((m.physical_offset, record))
        hot.remember([(m.physical_offset, codec.decoded_fields(record, m))])
    size = len(records[0][1])
    assert hot.held_bytes == len(hot) * size <= 1000 < (len(hot) + 1) * size
    held = [offset for offset, _ in records if hot.get(offset) is not None]
    assert held == [offset for offset, _ in records[-len(hot):]]
    assert hot.get(records[0][0]) is None
    # A size that does not match the held message's is a miss, never a wrong message.
    assert hot.get(records[-1][0], size + 1) is None


@pytest.mark.parametrize("name, value", [("N", 5), (7, "v"), ("N", None)])
def test_a_property_that_is_not_text_is_refused_by_encode(name, value):
    # What is held must be what decode gives back: a str for every property.
    m = message("T", b"x")
    m.properties[name] = value  # type: ignore[index, assignment]
    with pytest.raises(codec.MessageEncodeError, match="must be str"):
        codec.encode(m)


def test_disabled_holds_nothing():
    hot = HotMessages(0)
    assert not hot.enabled


async def test_a_held_message_that_retention_removed_is_not_read(tmp_path):
    c = StoreCluster(str(tmp_path), data_file_size=16 * 1024, max_entry_size=8 * 1024, retention_s=0.0,
                     retention_check_interval_s=0.2, store={"clean_interval_s": 0.2})
    await c.start()
    try:
        await c.create_topic("T", queues=1)
        store = await c.leader_store()
        results = []
        for _ in range(12):
            results += await store.put_messages([message("T", os.urandom(1000)) for _ in range(4)])
        first = results[0].physical_offset
        assert store.read_message(first) is not None      # held, and still in the log
        leader = await c.wait_leader()
        await c.wait_log_cut([leader], past=results[0].index)
        assert first in store.commit_log.hot._held        # still held in memory ...
        assert store.read_message(first) is None          # ... but gone from the log: not read
        last = results[-1]
        assert store.read_message(last.physical_offset, last.size) is not None
    finally:
        await c.stop()
