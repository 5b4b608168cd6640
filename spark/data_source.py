"""The PySpark data source `dledger`: committed log entries as a DataFrame.

    spark.session.register(spark)   # registers DLedgerDataSource (as dledger_python beside the JVM reader)
    spark.read.format("dledger").load("/var/lib/dledger/n0")                 # a node's files
    spark.read.format("dledger").option("servers", "h1:20911,h2:20911").load()  # a running group
    spark.readStream.format("dledger").option("servers", ...).load()         # new commits as they come

Only entries at or below the committed index are ever returned: for files,
the committedIndex in the node's checkpoint; live, the leader's committed
index when the query is planned. The columns are in spark/schema.py, the
options in spark/options.py.

With the JVM reader's jar on the classpath (spark/jvm_reader.py, spark/session.py),
`format("dledger")` is the Java provider io.pydledger.spark.DLedgerSource: it reads
batch queries over a node's files itself (columnar, faster than Parquet) and hands
everything else to this source, registered then as "dledger_python".
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition)
from pyspark.sql.types import StructType

from spark.log_files import LogFilesError
from spark.log_source import committed_log, read_partition
from spark.options import OptionError, SourceOptions
from spark.schema import SCHEMA, requested_columns

FORMAT = "dledger"
# With the JVM reader on the classpath, "dledger" is its provider (spark/jvm), which
# reads file mode itself and hands every other query to this source under this name.
PYTHON_FORMAT = "dledger_python"


class DLedgerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if SourceOptions.parse(self.options).include_properties:
            return SCHEMA
        return StructType([field for field in SCHEMA.fields if field.name != "properties"])

    def reader(self, schema: StructType) -> DataSourceReader:
        options = SourceOptions.parse(self.options)
        if options.reader == "jvm":
            # The JVM provider (spark/jvm) takes reader=jvm itself; here it is not on the classpath.
            raise OptionError("reader=jvm: the dledger JVM reader is not on this session's classpath "
                              "(spark/jvm_reader.py logs why; without javac the Python reader reads batches)")
        return DLedgerBatchReader(options, _checked(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark.stream_reader import DLedgerStreamReader

        return DLedgerStreamReader(SourceOptions.parse(self.options), _checked(schema))


    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark.sink import DLedgerBatchWriter, SinkOptions

        _refuse_overwrite(overwrite)
        return DLedgerBatchWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark.sink import DLedgerStreamWriter, SinkOptions

        _refuse_overwrite(overwrite)
        return DLedgerStreamWriter(SinkOptions.parse(self.options, schema))


class DLedgerPythonDataSource(DLedgerDataSource):
    """The same source, registered under the name the JVM provider delegates to
    (Spark refuses a Python source whose name a JVM source already has)."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_FORMAT


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("mode overwrite: a topic is only appended to (messages cannot be taken back); "
                          "use mode('append')")


def _checked(schema: StructType) -> StructType:
    """A query's own schema must be a subset of ours (see requested_columns)."""
    try:
        requested_columns(schema)
    except ValueError as error:
        raise OptionError(str(error)) from None
    return schema


class DLedgerBatchReader(DataSourceReader):
    """Plans once, on the driver: the committed index is read then, so the
    ranges (and the query's result) are fixed whatever is committed later."""

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        log = committed_log(self.options)
        begin, committed = log.bounds()
        first = batch_start_index(self.options, begin)
        if first < begin:
            raise LogFilesError(f"startIndex {first} is below the first entry still in the log ({begin}); "
                                f"retention deleted the entries before it")
        last = committed if self.options.end_index is None else min(self.options.end_index, committed)
        if first > last:
            return []
        return log.plan(first, last)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch] | Iterator[tuple]:
        return read_partition(partition, self.options, self.schema)


def batch_start_index(options: SourceOptions, begin: int) -> int:
    """Where a batch query starts: startIndex, or startingOffsets as an index;
    earliest (the default) and per-queue JSON start at the log's beginning."""
    if options.start_index is not None:
        return options.start_index
    starting = options.starting_offsets
    if starting == "latest" and options.starting_given:
        raise OptionError("startingOffsets=latest is for streams: a batch query from the latest offset reads "
                          "nothing (give earliest, a log index or per-queue JSON)")
    queues = options.starting_queue_offsets or {}
    latest = [f"{topic}/{queue}" for topic, offsets in queues.items() for queue, v in offsets.items() if v == -1]
    if latest:
        raise OptionError(f"startingOffsets: -1 (latest) for {', '.join(latest)} reads nothing in a batch query")
    return int(starting) if starting.isdigit() else begin
