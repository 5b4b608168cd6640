"""Where the rows come from: a node's files or a running group, behind one
small interface the batch and the stream reader share.

    bounds()          (begin index, committed index) now
    plan(first, last) input partitions covering entries first..last
    read(partition)   RecordBatches of one partition (runs on executors)
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from spark.entry_scan import scan_file_range
from spark.live_log import committed_bounds, group_view, live_batches, live_entries
from spark.log_files import LogFiles, LogFilesError
from spark.options import SourceOptions
from spark.partitions import FileRange, LiveRange, plan_file_ranges, plan_live_ranges, segment_spans
from spark.row_builder import record_tuples, scanned_record_batches
from spark.row_filter import FILTER_COLUMNS, RowFilter
from spark.schema import COLUMNS, arrow_schema_of, requested_columns
from spark.vector_decode import file_range_batches


class CommittedLog(Protocol):
    def bounds(self) -> tuple[int, int]: ...

    def plan(self, first_index: int, last_index: int) -> Sequence[InputPartition]: ...


class FileLog:
    """A node's data dir (or a copy of its segments), looked at afresh on
    every call: a running node keeps adding segments and moving its checkpoint."""

    def __init__(self, options: SourceOptions) -> None:
        assert options.path is not None
        self.options = options

    def files(self) -> LogFiles:
        return LogFiles.locate(self.options.path or "", self.options.node_id)

    def bounds(self) -> tuple[int, int]:
        files = self.files()
        spans = segment_spans(files)
        committed = files.committed_index
        if committed is None:
            if self.options.end_index is None:
                raise LogFilesError(f"{files.base_dir} has no checkpoint, so which entries are committed is "
                                    f"unknown; give the last committed index as the endIndex option")
            committed = self.options.end_index
        begin = spans[0].first_index if spans else committed + 1
        return begin, committed

    def plan(self, first_index: int, last_index: int) -> list[FileRange]:
        return plan_file_ranges(self.files(), first_index, last_index, self.options.max_partition_bytes,
                                self.options.min_partitions)


class LiveLog:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def bounds(self) -> tuple[int, int]:
        return committed_bounds(self.options.servers, self.options.group, access=self.options.access)

    def plan(self, first_index: int, last_index: int) -> list[LiveRange]:
        replicas = group_view(self.options.servers, self.options.group, access=self.options.access).followers \
            if self.options.prefer_replicas else ()
        return plan_live_ranges(self.options.servers, self.options.group, first_index, last_index,
                                self.options.entries_per_partition, replicas, self.options.max_bytes_per_second,
                                self.options.min_partitions, self.options.access,
                                raw_http=self.options.live_transport == "auto")


def committed_log(options: SourceOptions) -> CommittedLog:
    return LiveLog(options) if options.live else FileLog(options)


def read_partition(partition: InputPartition, options: SourceOptions,
                   schema: StructType | None = None) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """The rows of one partition; what an executor runs. `schema` (a subset
    of the source's columns, see spark.schema.requested_columns) limits what
    is decoded; None means every column."""
    columns = requested_columns(schema)
    selection = RowFilter.of(options)
    decoded = columns if columns is None or selection is None else \
        tuple(c for c in COLUMNS if c in columns or c in FILTER_COLUMNS)
    topics, arrow = options.topics, options.arrow or selection is not None
    if isinstance(partition, FileRange):
        batches = file_range_batches(partition, topics, decoded) if arrow else None
        entries = scan_file_range(partition) if batches is None else None
    elif isinstance(partition, LiveRange):
        batches = live_batches(partition, topics, decoded) if arrow else None
        entries = live_entries(partition) if batches is None else None
    elif type(partition) is InputPartition and partition.value is None:
        return iter(())  # Spark's stand-in when planning found nothing to read
    else:
        raise TypeError(f"not a dledger partition: {partition!r}")
    if entries is not None and arrow:
        batches = (b if decoded is None else b.select(list(decoded))
                   for b in scanned_record_batches(entries, topics))
    if batches is not None:
        if selection is not None:
            batches = (selection.apply(b) for b in batches)
        if decoded != columns:
            batches = (b.select(list(columns or COLUMNS)) for b in batches)
        return _conform(batches, schema)
    rows = record_tuples(entries or iter(()), topics)
    if columns is None:
        return rows
    at = [COLUMNS.index(name) for name in columns]
    return (tuple(row[k] for k in at) for row in rows)


def _conform(batches: Iterator[pa.RecordBatch], schema: StructType | None) -> Iterator[pa.RecordBatch]:
    """Batches labelled with the Arrow schema PySpark expects for `schema`
    (a query's own schema may call a column nullable that ours does not)."""
    target = arrow_schema_of(schema)
    for batch in batches:
        if batch.schema.names != target.names:  # the vectorised decoder keeps the source's column order
            batch = batch.select(target.names)
        if batch.schema.equals(target):
            yield batch
        else:
            yield pa.RecordBatch.from_arrays([column if column.type == field.type else column.cast(field.type)
                                              for column, field in zip(batch.columns, target)], schema=target)
