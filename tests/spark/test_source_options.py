"""The options Spark's Kafka source users expect, on a hand-built log: per-queue
starting and ending offsets, startingTimestamp, subscribePattern,
minPartitions, includeProperties; unknown and contradictory options refused
with their names. The data source's readers run here as plain Python (what
Spark calls on the driver and the executors), so no SparkSession is needed."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from dledger.config import DLedgerConfig, PeerAddress
from dledger.entry import CHANNEL_LOG_API, CHANNEL_STATE_MACHINE
from dledger.store.file_store import DLedgerFileStore
from spark.data_source import DLedgerDataSource
from spark.options import OptionError, SourceOptions
from spark.stream_reader import DLedgerStreamReader
from store.codec import MessageExt, encode
from store.socket_address import SocketAddress

HOST = SocketAddress("127.0.0.1", 10911)
T0 = 1_700_000_000_000
# (topic, queue) -> messages; message k of a queue has queue offset k and is
# stored at T0 + 1000 * (its position in the log).
QUEUES = {("Orders", 0): 6, ("Orders", 1): 5, ("Payments", 0): 4, ("Audit", 0): 3}


def build_log(directory: Path) -> list[dict]:
    """Messages of every queue interleaved, with a raw client entry between;
    returns what each message row must hold."""
    config = DLedgerConfig(self_id="n0", peers=(PeerAddress("n0", "127.0.0.1", 1),), data_dir=str(directory),
                           preallocate=False, data_file_size=1 << 20, index_file_size=32 * 1024,
                           max_entry_size=200 << 10)
    store = DLedgerFileStore(config)
    store.open()
    order = [(t, q, k) for k in range(max(QUEUES.values())) for (t, q), n in QUEUES.items() if k < n]
    expected = []
    for at, (topic, queue, k) in enumerate(order):
        stored = T0 + 1000 * at
        body = encode(MessageExt(topic=topic, body=b"%s-%d-%d" % (topic.encode(), queue, k), queue_id=queue,
                                 queue_offset=k, born_timestamp=stored - 1, store_timestamp=stored, born_host=HOST,
                                 store_host=HOST, properties={"TAGS": "t"}))
        [(index, _)] = store.append_as_leader([body], term=1, channel=CHANNEL_STATE_MACHINE)
        expected.append({"index": index, "topic": topic, "queue_id": queue, "queue_offset": k, "stored": stored})
        store.append_as_leader([b"raw-%d" % at], term=1, channel=CHANNEL_LOG_API)
    store.set_committed_index(store.ledger_end_index)
    store.close()
    return expected


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    directory = tmp_path_factory.mktemp("options-log")
    return str(directory), build_log(directory)


def batch_rows(path: str, **options: str) -> list[tuple]:
    source = DLedgerDataSource({"path": path, **options})
    reader = source.reader(source.schema())
    table = pa.Table.from_batches([b for part in reader.partitions() for b in reader.read(part)])
    return sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in table.to_pylist() if r["kind"] == "message")


def expected(log: list[dict], keep) -> list[tuple]:  # noqa: ANN001
    return sorted((m["topic"], m["queue_id"], m["queue_offset"]) for m in log if keep(m))


def test_per_queue_starting_and_ending_offsets_select_exactly_those_messages(log):
    path, messages = log
    starting = {"Orders": {"0": 2, "1": -2}, "Payments": {"0": 3}}
    ending = {"Orders": {"0": 5, "1": 4}, "Payments": {"0": -1}}
    got = batch_rows(path, startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending))
    # The JSON's topics are the subscription; bounds: Orders/0 [2, 5), Orders/1 [0, 4), Payments/0 [3, end).
    assert got == [("Orders", 0, 2), ("Orders", 0, 3), ("Orders", 0, 4), ("Orders", 1, 0), ("Orders", 1, 1),
                   ("Orders", 1, 2), ("Orders", 1, 3), ("Payments", 0, 3)]
    # A queue the JSON leaves out is read whole, when the topic option subscribes to it.
    got = batch_rows(path, topic="Orders,Audit", startingOffsets=json.dumps({"Orders": {"0": 4}}))
    assert got == expected(messages, lambda m: m["topic"] == "Audit" or (m["topic"], m["queue_id"]) == ("Orders", 1)
                           or (m["topic"] == "Orders" and m["queue_offset"] >= 4))


def test_starting_timestamp_and_subscribe_pattern(log):
    path, messages = log
    since = messages[7]["stored"]
    assert batch_rows(path, startingTimestamp=str(since)) == expected(messages, lambda m: m["stored"] >= since)
    assert batch_rows(path, startingTimestamp=str(since + 1)) == expected(messages, lambda m: m["stored"] > since)
    # The pattern matches the whole topic: "Order" alone matches nothing.
    assert batch_rows(path, subscribePattern="(Orders|Pay.*)") == \
        expected(messages, lambda m: m["topic"] in ("Orders", "Payments"))
    assert batch_rows(path, subscribePattern="Order") == []


def test_min_partitions_and_include_properties(log, monkeypatch):
    path, messages = log
    source = DLedgerDataSource({"path": path, "minPartitions": "3"})
    assert len(source.reader(source.schema()).partitions()) == 1  # a tiny log: 4 MiB is the smallest task
    monkeypatch.setattr("spark.partitions.MIN_PARTITION_BYTES", 256)
    parts = source.reader(source.schema()).partitions()
    assert len(parts) == 3 and [p.first_index for p in parts][0] == 0 and parts[-1].last_index == 2 * len(messages) - 1
    without = DLedgerDataSource({"path": path, "includeProperties": "false"})
    assert "properties" not in without.schema().fieldNames()
    reader = without.reader(without.schema())
    batch = next(b for part in reader.partitions() for b in reader.read(part))
    assert "properties" not in batch.schema.names and batch.column("tags")[0].as_py() == "t"


@pytest.mark.parametrize("options, message", [
    ({"startIndx": "40"}, "unknown option 'startindx' (did you mean startIndex?)"),
    ({"startingOffset": "earliest"}, "unknown option 'startingoffset' (did you mean startingOffsets?)"),
    ({"startIndex": "3", "startingOffsets": "5"}, "options startIndex and startingOffsets contradict"),
    ({"endIndex": "3", "endingOffsets": '{"Orders": {"0": 1}}'}, "options endIndex and endingOffsets contradict"),
    ({"topic": "Orders", "subscribePattern": "O.*"}, "options topic and subscribePattern contradict"),
    ({"startingTimestamp": "5", "startingOffsets": "earliest"}, "startingTimestamp and startingOffsets"),
    ({"topic": "Orders", "startingOffsets": '{"Audit": {"0": 1}}'}, "names topic 'Audit' that the topic"),
    ({"startingOffsets": '{"Orders": {"x": 1}}'}, "queue id 'x' is not an integer"),
    ({"startingOffsets": '{"Orders": {"0": -3}}'}, "topic 'Orders' queue 0"),
    ({"endingOffsets": '{"Orders": {"0": -2}}'}, "-2 (earliest) cannot end a read"),
    ({"entriesPerPartition": "10"}, "entriesPerPartition only applies to live mode"),
    ({"liveTransport": "grpc"}, "liveTransport only applies to live mode"),
    ({"subscribePattern": "("}, "subscribePattern: not a regular expression"),
])
def test_unknown_and_contradictory_options_are_refused_by_name(log, options, message):
    path, _ = log
    with pytest.raises(OptionError) as error:
        SourceOptions.parse({"path": path, **options})
    assert message in str(error.value)


def test_live_transport_takes_auto_or_grpc():
    assert SourceOptions.parse({"servers": "127.0.0.1:1"}).live_transport == "auto"
    assert SourceOptions.parse({"servers": "127.0.0.1:1", "liveTransport": "GRPC"}).live_transport == "grpc"
    with pytest.raises(OptionError, match="liveTransport: expected auto or grpc, got 'http'"):
        SourceOptions.parse({"servers": "127.0.0.1:1", "liveTransport": "http"})


def test_batch_and_stream_starting_points_that_read_nothing_are_refused(log):
    path, messages = log
    with pytest.raises(OptionError, match="startingOffsets=latest is for streams"):
        batch_rows(path, startingOffsets="latest")
    with pytest.raises(OptionError, match="-1 \\(latest\\) for Orders/0 reads nothing"):
        batch_rows(path, startingOffsets='{"Orders": {"0": -1}}')
    committed = 2 * len(messages) - 1
    stream = DLedgerStreamReader(SourceOptions.parse({"path": path, "startingOffsets": str(committed + 5)}))
    with pytest.raises(OptionError, match=f"startingOffsets {committed + 5} is past the committed index {committed}"):
        stream.initialOffset()
    assert DLedgerStreamReader(SourceOptions.parse({"path": path, "startingOffsets": str(committed + 1)})) \
        .initialOffset() == {"committed_index": committed}  # the next entry: nothing yet, but not past
    with pytest.raises(OptionError, match="startIndex: for batch queries only"):
        DLedgerStreamReader(SourceOptions.parse({"path": path, "startIndex": "3"})).initialOffset()
    json_start = DLedgerStreamReader(SourceOptions.parse({"path": path, "startingOffsets": '{"Orders": {"0": 3}}'}))
    assert json_start.initialOffset() == {"committed_index": -1}  # from the beginning, rows chosen per queue
    rows = [r for part in json_start.partitions({"committed_index": -1}, {"committed_index": committed})
            for b in json_start.read(part) for r in b.to_pylist()]
    assert sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in rows) == \
        expected(messages, lambda m: m["topic"] == "Orders" and (m["queue_id"] == 1 or m["queue_offset"] >= 3))
