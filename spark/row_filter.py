"""Rows chosen after decoding, the way Spark's Kafka source chooses records:
subscribePattern, per-queue starting and ending offsets, startingTimestamp.

A log index range cannot express these (a queue's offsets are spread over the
whole log), so they are applied to each decoded RecordBatch with
pyarrow.compute, on the executors. `topic` is not here: the decoder itself
keeps only those topics' messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from spark.options import EARLIEST, LATEST, QueueOffsets, SourceOptions
from spark.schema import KIND_MESSAGE

# The columns the selection reads, whatever the query asked for.
FILTER_COLUMNS: Final = ("kind", "topic", "queue_id", "queue_offset", "store_timestamp")


@dataclass(frozen=True)
class RowFilter:
    pattern: str | None
    starting: QueueOffsets | None
    ending: QueueOffsets | None
    starting_timestamp_ms: int | None

    @classmethod
    def of(cls, options: SourceOptions) -> "RowFilter | None":
        if not options.selects_rows:
            return None
        return cls(options.subscribe_pattern, options.starting_queue_offsets, options.ending_queue_offsets,
                   options.starting_timestamp)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keep = pc.equal(batch.column("kind"), KIND_MESSAGE)
        topic, queue, offset = batch.column("topic"), batch.column("queue_id"), batch.column("queue_offset")
        if self.pattern is not None:  # the whole topic, as Kafka's Pattern.matcher(topic).matches()
            keep = pc.and_(keep, pc.match_substring_regex(topic, f"^(?:{self.pattern})$"))
        for queues, below in ((self.starting, True), (self.ending, False)):
            for name, offsets in (queues or {}).items():
                for queue_id, bound in offsets.items():
                    if bound in (EARLIEST, LATEST):
                        continue  # no bound on that side
                    here = pc.and_(pc.equal(topic, name), pc.equal(queue, queue_id))
                    outside = pc.less(offset, bound) if below else pc.greater_equal(offset, bound)
                    keep = pc.and_(keep, pc.invert(pc.and_(here, outside)))
        if self.starting_timestamp_ms is not None:
            since = pa.scalar(self.starting_timestamp_ms * 1000, batch.schema.field("store_timestamp").type)
            keep = pc.and_(keep, pc.greater_equal(batch.column("store_timestamp"), since))
        return batch.filter(pc.fill_null(keep, False))
