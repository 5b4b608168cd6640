"""Input partitions and how a query is cut into them.

A partition carries only what an executor on another machine needs: a file
path and a byte position plus an index range (file mode), or the servers and
an index range (live mode). Nothing refers to driver memory, so the planning
here can run on the driver and the reading anywhere that sees the same files
or reaches the same servers.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from dledger.entry import INDEX_RECORD_SIZE
from spark.log_files import LogFiles, LogFilesError, SegmentFile
from spark.options import LiveAccess


# Spark's spark.sql.files.openCostInBytes: a task is worth at least this much reading.
MIN_PARTITION_BYTES = 4 << 20


@dataclass(frozen=True)
class FileRange(InputPartition):
    """Entries first_index..last_index of one data segment, the first of them
    at absolute position `pos` (or, with pos None, found by walking from the
    segment's start). previous_chain_crc links the first entry to the one
    before it (None: not checked, e.g. a bare copy without index files)."""
    path: str
    segment_start: int
    segment_size: int
    first_index: int
    last_index: int
    pos: int | None
    previous_chain_crc: int | None
    # (path, start, size) of the index files holding the range's records:
    # entry positions for the vectorised decoder (spark/vector_decode.py).
    index_segments: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class LiveRange(InputPartition):
    """Committed entries first_index..last_index: from `replicas` (addresses,
    in the order to try them) and then from the group's leader."""
    servers: tuple[str, ...]
    group: str
    first_index: int
    last_index: int
    replicas: tuple[str, ...] = ()
    max_bytes_per_second: int | None = None
    access: LiveAccess = LiveAccess()
    raw_http: bool = True  # liveTransport=auto: a replica's runs from its HTTP port where it offers them


@dataclass(frozen=True)
class SegmentSpan:
    """A non-empty data segment and its first entry (the next segment's first
    entry, or the committed index, ends it)."""
    segment: SegmentFile
    first_index: int
    first_pos: int


def segment_spans(files: LogFiles) -> list[SegmentSpan]:
    """Each non-empty data segment with its first entry (one 48-byte read each)."""
    spans: list[SegmentSpan] = []
    for segment in files.data:
        first = files.first_entry_of(segment)
        if first is not None:
            spans.append(SegmentSpan(segment, first[0], first[1]))
    return spans


def plan_file_ranges(files: LogFiles, first_index: int, last_index: int,
                     max_partition_bytes: int, min_partitions: int = 1) -> list[FileRange]:
    """Cut entries first_index..last_index into ranges: never across a segment,
    and, where the index files tell positions, at most about
    `max_partition_bytes` each (a 1 GiB segment would otherwise be one task).
    As Spark's file sources do, a small read is cut finer so that it makes
    about `min_partitions` tasks (no smaller than MIN_PARTITION_BYTES each),
    and a large one into a multiple of `min_partitions` tasks."""
    spans = segment_spans(files)
    if min_partitions > 1 and first_index <= last_index:
        first, last = files.index_record(first_index), files.index_record(last_index)
        if first is not None and last is not None:
            total = last[0] + last[1] - first[0]
            # A multiple of min_partitions tasks, so that the cores finish together
            # (3 tasks on 2 cores leave one idle for a third of the read).
            count = max(min_partitions, -(-total // max_partition_bytes))
            count = -(-count // min_partitions) * min_partitions
            max_partition_bytes = max(MIN_PARTITION_BYTES, -(-total // count))
    ranges: list[FileRange] = []
    for k, span in enumerate(spans):
        span_last = spans[k + 1].first_index - 1 if k + 1 < len(spans) else last_index
        low, high = max(first_index, span.first_index), min(last_index, span_last)
        if low > high:
            continue
        ranges.extend(_split_span(files, span, low, high, max_partition_bytes))
    _check_coverage(ranges, first_index, last_index, spans)
    return ranges


def _split_span(files: LogFiles, span: SegmentSpan, low: int, high: int,
                max_partition_bytes: int) -> list[FileRange]:
    segment = span.segment
    low_record = files.index_record(low) if low != span.first_index else (span.first_pos, 0, 0)
    high_record = files.index_record(high)
    if low_record is None or high_record is None:
        # No index files (a bare copy): one partition walks the segment.
        pos = span.first_pos if low == span.first_index else None
        return [FileRange(segment.path, segment.start, segment.size, low, high, pos, None)]
    span_bytes = high_record[0] + high_record[1] - low_record[0]
    parts = max(1, min(high - low + 1, -(-span_bytes // max_partition_bytes)))
    bounds = [low + (high - low + 1) * i // parts for i in range(parts)] + [high + 1]
    ranges: list[FileRange] = []
    for first, following in zip(bounds, bounds[1:]):
        record = low_record if first == low else files.index_record(first)
        if record is None:
            raise LogFilesError(f"{files.base_dir}: no index record for entry {first}")
        ranges.append(FileRange(segment.path, segment.start, segment.size, first, following - 1, record[0],
                                _previous_chain_crc(files, first), _index_segments(files, first, following - 1)))
    return ranges


def _index_segments(files: LogFiles, first: int, last: int) -> tuple[tuple[str, int, int], ...]:
    low, high = first * INDEX_RECORD_SIZE, (last + 1) * INDEX_RECORD_SIZE
    return tuple((s.path, s.start, s.size) for s in files.index if s.start < high and s.end > low)


def _previous_chain_crc(files: LogFiles, index: int) -> int | None:
    previous = files.index_record(index - 1) if index > 0 else None
    if previous is None:
        return None
    return files.chain_crc_at(previous[0])


def _check_coverage(ranges: list[FileRange], first_index: int, last_index: int,
                    spans: list[SegmentSpan]) -> None:
    """The committed entries asked for must all be on disk: a gap means
    retention deleted them or a segment is missing from a copy."""
    if first_index > last_index:
        return
    begin = spans[0].first_index if spans else None
    if begin is None or begin > first_index:
        raise LogFilesError(f"entries from {first_index} were asked for but the log's files begin at "
                            f"{'no entry' if begin is None else begin}")
    expected = first_index
    for partition in ranges:
        if partition.first_index != expected:
            raise LogFilesError(f"entries {expected}..{partition.first_index - 1} are missing from the files")
        expected = partition.last_index + 1
    if expected != last_index + 1:
        raise LogFilesError(f"entries {expected}..{last_index} are committed but not in the files")


def plan_live_ranges(servers: tuple[str, ...], group: str, first_index: int, last_index: int,
                     entries_per_partition: int, replicas: tuple[str, ...] = (),
                     max_bytes_per_second: int | None = None, min_partitions: int = 1,
                     access: LiveAccess = LiveAccess(), raw_http: bool = True) -> list[LiveRange]:
    """Fixed index ranges, decided once at planning: re-running a task reads
    the same committed entries, whoever leads by then. Partition k tries the
    replicas starting from the k-th, so reads spread over the followers."""
    count = last_index - first_index + 1
    if count > 0 and min_partitions > 1:
        entries_per_partition = min(entries_per_partition, max(1, -(-count // min_partitions)))
    ranges: list[LiveRange] = []
    start = first_index
    while start <= last_index:
        end = min(last_index, start + entries_per_partition - 1)
        k = len(ranges) % len(replicas) if replicas else 0
        ranges.append(LiveRange(servers, group, start, end, replicas[k:] + replicas[:k], max_bytes_per_second,
                                access, raw_http))
        start = end + 1
    return ranges
