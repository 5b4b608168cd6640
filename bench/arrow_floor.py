"""The floor of any PySpark Python data source (bench/replay.py's
spark_floor_* rows): what Spark's JVM costs to take Arrow batches from a
Python worker and hand them on, with no decoding at all in Python.

`dledger_prebuilt` has the `dledger` source's schema and yields, per
partition, the same prebuilt RecordBatch (the corpus's first rows, decoded
once per worker process) over and over until it has handed over its share of
the rows. Whatever a Python reader does, it cannot be faster than this: the
time left is the JVM's (ArrowPythonRunner reading the batches,
ColumnarBatch.rowIterator and an UnsafeProjection copying every row, since
PythonPartitionReaderFactory offers no columnar reads), plus the aggregate.
`floor_map_in_arrow` does the same through DataFrame.mapInArrow, which runs
on the same evaluator (MapInBatchEvaluatorFactory) and so is no way around it.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark.schema import SCHEMA

SAMPLE_ROWS = 4096
_sample: dict[str, pa.RecordBatch] = {}


def sample_batch(corpus: str) -> pa.RecordBatch:
    """The corpus's first SAMPLE_ROWS rows as one batch, decoded once per process."""
    if corpus not in _sample:
        from spark.log_source import FileLog, read_partition
        from spark.options import SourceOptions

        options = SourceOptions.parse({"path": corpus})
        log = FileLog(options)
        begin, committed = log.bounds()
        batches = []
        for part in log.plan(begin, min(committed, begin + SAMPLE_ROWS - 1)):
            batches.extend(read_partition(part, options))
        _sample[corpus] = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    return _sample[corpus]


def repeated(corpus: str, rows: int) -> Iterator[pa.RecordBatch]:
    batch = sample_batch(corpus)
    while rows > 0:
        yield batch if rows >= batch.num_rows else batch.slice(0, rows)
        rows -= batch.num_rows


@dataclass
class RowCount(InputPartition):
    rows: int


class PrebuiltDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dledger_prebuilt"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PrebuiltReader(self.options["path"], int(self.options["rows"]), int(self.options["partitions"]))


class PrebuiltReader(DataSourceReader):
    def __init__(self, corpus: str, rows: int, partitions: int) -> None:
        self.corpus, self.rows, self.parts = corpus, rows, partitions

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.parts)
        return [RowCount(share + (1 if i < extra else 0)) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowCount)
        return repeated(self.corpus, partition.rows)


def map_in_arrow_available() -> bool:
    """PySpark 4.3's mapInArrow refuses to run without pandas (>= 2.2)
    installed, though it hands the function Arrow batches."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def floor_map_in_arrow(spark: Any, corpus: str, rows: int, partitions: int) -> Any:
    """The same batches through DataFrame.mapInArrow over one row per partition."""
    share = rows // partitions

    def produce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for _ in range(batch.num_rows):
                yield from repeated(corpus, share)
    return spark.range(0, partitions, 1, partitions).mapInArrow(produce, SCHEMA)


def register(spark: Any) -> None:
    """Workers cannot import bench/ (not an installed package): ship this module by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(PrebuiltDataSource)
