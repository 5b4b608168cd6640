"""Streaming reads: `spark.readStream.format("dledger")`.

The offset is the committed index: {"committed_index": N} means every entry up
to N has been handed to the query. A micro-batch (start, end] reads entries
start+1..end, which are committed and so never change: Spark replaying a
batch after a restart from its checkpoint gets exactly the same rows, which
is what makes a restarted query lose and repeat nothing.

latestOffset and prepareForTriggerAvailableNow run in one long-lived Python
process on the driver, so the availableNow target kept on `self` persists.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from spark.log_files import LogFilesError
from spark.log_source import committed_log, read_partition
from spark.options import OptionError, SourceOptions

OFFSET_KEY = "committed_index"


def offset(committed_index: int) -> dict[str, int]:
    return {OFFSET_KEY: committed_index}


class DLedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema
        self._target: int | None = None  # the availableNow stop point

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts (a restarted one resumes from its checkpoint instead)."""
        _refuse_batch_options(self.options)
        begin, committed = committed_log(self.options).bounds()
        starting = self.options.starting_offsets
        if starting == "json":
            values = {v for offsets in (self.options.starting_queue_offsets or {}).values() for v in offsets.values()}
            if values == {-1}:
                return offset(committed)  # every queue from its end: latest
            if -1 in values:
                raise OptionError("startingOffsets: a stream takes -1 (latest) for every queue or for none; "
                                  "mix earliest (-2) and queue offsets instead")
            return offset(begin - 1)  # the queue offsets select rows from the beginning on
        if self.options.starting_timestamp is not None or starting == "earliest":
            return offset(begin - 1)
        if starting == "latest":
            return offset(committed)
        if int(starting) > committed + 1:
            raise OptionError(f"startingOffsets {starting} is past the committed index {committed}: a stream "
                              f"from there would wait for entries that do not exist yet")
        return offset(int(starting) - 1)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_entries_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        _, committed = committed_log(self.options).bounds()
        end = committed if self._target is None else min(committed, self._target)
        if isinstance(limit, ReadMaxRows):
            # Log entries, not rows: NOOPs and other topics count too, which
            # keeps the bound a pure function of the offsets.
            end = min(end, start[OFFSET_KEY] + limit.max_rows)
        return offset(max(end, start[OFFSET_KEY]))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = committed_log(self.options).bounds()[1]

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        first, last = start[OFFSET_KEY] + 1, end[OFFSET_KEY]
        if first > last:
            return []
        log = committed_log(self.options)
        begin, _ = log.bounds()
        if first < begin:
            if self.options.fail_on_data_loss:
                raise LogFilesError(f"entries {first}..{begin - 1} were deleted by retention before this query "
                                    f"read them (set failOnDataLoss=false to skip them)")
            first = begin
            if first > last:
                return []
        return log.plan(first, last)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch] | Iterator[tuple]:
        return read_partition(partition, self.options, self.schema)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: committed entries stay until retention takes them."""


def _refuse_batch_options(options: SourceOptions) -> None:
    given = [name for name, value in (("startIndex", options.start_index), ("endIndex", options.end_index),
                                      ("endingOffsets", options.ending_queue_offsets)) if value is not None]
    if given:
        raise OptionError(f"{', '.join(given)}: for batch queries only (a stream starts at startingOffsets or "
                          f"startingTimestamp and does not end)")
