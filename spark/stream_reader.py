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
from spark.options import SourceOptions

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
        begin, committed = committed_log(self.options).bounds()
        starting = self.options.starting_offsets
        if starting == "earliest":
            return offset(begin - 1)
        if starting == "latest":
            return offset(committed)
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
        return read_partition(partition, self.options.topics, self.options.arrow, self.schema)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: committed entries stay until retention takes them."""
