"""The data source `dledger_consumequeue`: a broker's ConsumeQueue units as rows.

    spark.read.format("dledger_consumequeue").load(NODE_DATA_DIR)

One partition per ConsumeQueue file (`<node dir>/store/consumequeue/<topic>/
<queue id>/<20-digit byte offset>`, 20-byte units: commit log offset, size,
tag hash), read only. This is the broker's side of the replay check: the
units the broker derived from committed entries, joined against the units the
replay derives from the same entries.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from dledger.store.segment import parse_segment_name
from store.consume_queue import BLANK_UNIT, CQ_STORE_UNIT_SIZE

FORMAT = "dledger_consumequeue"
SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("physical_offset", LongType(), False),
    StructField("size", IntegerType(), False),
    StructField("tags_code", LongType(), False),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
_UNIT = struct.Struct(">qiq")


@dataclass(frozen=True)
class QueueFile(InputPartition):
    topic: str
    queue_id: int
    path: str
    start: int  # byte offset of the file's first unit in the queue


def consume_queue_root(path: str) -> str:
    """`<path>/store/consumequeue`, `<path>/consumequeue` or `path` itself."""
    for candidate in (os.path.join(path, "store", "consumequeue"), os.path.join(path, "consumequeue"), path):
        if os.path.basename(candidate) == "consumequeue" and os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(f"{path}: no store/consumequeue/ directory")


def queue_files(root: str) -> list[QueueFile]:
    files: list[QueueFile] = []
    for topic in sorted(os.listdir(root)):
        topic_dir = os.path.join(root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for queue in sorted(os.listdir(topic_dir)):
            queue_dir = os.path.join(topic_dir, queue)
            if not queue.isdigit() or not os.path.isdir(queue_dir):
                continue
            for name in sorted(os.listdir(queue_dir)):
                start = parse_segment_name(name)
                if start is not None:
                    files.append(QueueFile(topic, int(queue), os.path.join(queue_dir, name), start))
    return files


def read_units(part: QueueFile) -> pa.RecordBatch | None:
    """The file's units up to the first empty one (the queue's end; a unit
    being written by a running broker reads as empty or is cut there too).
    A queue that starts above offset 0 begins with blank filler units
    (ConsumeQueue.restart_at), which are not messages."""
    with open(part.path, "rb") as f:
        data = f.read()
    usable = len(data) - len(data) % CQ_STORE_UNIT_SIZE
    blanks = 0
    while data[blanks * CQ_STORE_UNIT_SIZE:(blanks + 1) * CQ_STORE_UNIT_SIZE] == BLANK_UNIT:
        blanks += 1
    offsets: list[int] = []
    sizes: list[int] = []
    codes: list[int] = []
    for phys_offset, size, tags_code in _UNIT.iter_unpack(memoryview(data)[blanks * CQ_STORE_UNIT_SIZE:usable]):
        if phys_offset <= 0 or size <= 0:
            break
        offsets.append(phys_offset)
        sizes.append(size)
        codes.append(tags_code)
    if not offsets:
        return None
    first = part.start // CQ_STORE_UNIT_SIZE + blanks
    count = len(offsets)
    return pa.RecordBatch.from_arrays([
        pa.array([part.topic] * count, pa.string()),
        pa.array([part.queue_id] * count, pa.int32()),
        pa.array(range(first, first + count), pa.int64()),
        pa.array(offsets, pa.int64()),
        pa.array(sizes, pa.int32()),
        pa.array(codes, pa.int64()),
    ], schema=ARROW_SCHEMA)


class ConsumeQueueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ConsumeQueueReader(self.options["path"])


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> Sequence[InputPartition]:
        return queue_files(consume_queue_root(self.path))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueFile)
        batch = read_units(partition)
        if batch is not None:
            yield batch
