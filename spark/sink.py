"""The `dledger` sink: DataFrame rows sent as messages through the broker.

    df.write.format("dledger").mode("append").option("servers", S).option("topic", T).save()
    df.writeStream.format("dledger").option("servers", S).option("topic", T) \\
        .option("checkpointLocation", CK).start()

Columns: `body` (binary or string, required); optional `topic` (overrides the
option), `keys` (a string or an array of strings), `tags`, `properties`
(map<string,string>), `message_group` (FIFO), `delivery_timestamp` (a
timestamp, or ms since the epoch as a long). Rows go through our client
(broker/client/producer.py, batched), so they get the broker's validation,
routing and ConsumeQueue entries, exactly as any producer's.

Idempotent on retry: every row's message id is derived from the write (a
random id made on the driver once per batch write; for a stream, the query's
id, which its checkpoint keeps across restarts, and the micro-batch id), the
Spark partition and the row's place in it. A retried task, or a micro-batch
replayed after a restart, sends the same ids, and the broker answers a
repeated id with the original receipt instead of storing it again (within
its dedupe window, broker/config.py dedupe_window_entries).

Bad rows (no body, a body over the broker's limit, an illegal topic ...:
what the broker refuses with a 400, 404 or 413 code) fail the task with a
message naming the row's topic and its index in the partition, unless
onBadRow=skip, which counts them (in the commit message the driver logs)
and sends the rest. Any other error (the cluster unavailable past the
producer's retries, an unknown outcome) fails the task whatever onBadRow
says: Spark's retry sends the same ids.

Spark hands the writers Arrow batches (DataSourceArrowWriter); a task
cuts them into chunks of batchSize rows, encodes each chunk a column at a
time (spark/sink_rows.py) and sends it as one call per topic, keeping up to
CHUNKS_IN_FLIGHT chunks unanswered.

Options: servers (required), topic (default topic), onBadRow (fail | skip),
batchSize (messages per batch, default 500), failFirstAttemptAfterRows
(fault injection for tests: attempt 0 of each task fails once that many rows
are sent).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (ArrayType, BinaryType, LongType, MapType, StringType, StructType, TimestampType)

from broker.client.errors import BadRequestError, NotFoundError, PayloadTooLargeError
from dledger.client import parse_servers
from spark.options import OptionError
from spark.sink_rows import (BadRowError, Chunk, EncodedRow, RowEncoder, chunks_of_batches, chunks_of_rows,
                             id_prefix, message_id)

__all__ = ["BadRowError", "DLedgerBatchWriter", "DLedgerStreamWriter", "SinkCommit", "SinkOptions", "is_bad_row",
           "message_id"]

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500
# What the broker (or the client's own check) says about one message: the
# row is at fault. Every other error (unavailable past the client's retries,
# an unknown outcome, forbidden) is the task's, which fails and is retried.
BAD_ROW_ERRORS = (BadRequestError, NotFoundError, PayloadTooLargeError)
# Chunks (of batchSize rows) sent and not yet answered, per task: enough to
# keep calls in flight while the next chunk is encoded.
CHUNKS_IN_FLIGHT = 4
SINK_OPTIONS = ("servers", "topic", "onBadRow", "batchSize", "failFirstAttemptAfterRows", "path")
# What Spark itself hands a stream sink among its options.
SPARK_OPTIONS = ("checkpointLocation", "queryName")
# column -> the Spark types it may have
COLUMN_TYPES: Mapping[str, tuple[type, ...]] = {
    "body": (BinaryType, StringType), "topic": (StringType,), "keys": (StringType, ArrayType),
    "tags": (StringType,), "properties": (MapType,), "message_group": (StringType,),
    "delivery_timestamp": (TimestampType, LongType),
}


@dataclass(frozen=True)
class SinkOptions:
    servers: tuple[str, ...]
    topic: str | None
    skip_bad_rows: bool
    batch_size: int
    fail_first_attempt_after: int | None
    ordered: bool = False   # rows have a message_group column: chunks go one after another

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> "SinkOptions":
        values = {key.lower(): value for key, value in options.items()}
        known = {name.lower(): name for name in SINK_OPTIONS + SPARK_OPTIONS}
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise OptionError(f"unknown sink option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
                              f" the dledger sink takes {', '.join(SINK_OPTIONS[:-1])}")
        if values.get("path"):
            raise OptionError("the dledger sink writes to a running cluster: give the servers option, not a path")
        try:
            servers = tuple(parse_servers(values.get("servers", "")))
        except ValueError as error:
            raise OptionError(f"servers: {error}") from None
        if not servers:
            raise OptionError("the dledger sink needs the servers option (the brokers, HOST:PORT,...)")
        _check_columns(schema)
        topic = values.get("topic") or None
        if topic is None and "topic" not in schema.fieldNames():
            raise OptionError("no topic: give the topic option or a topic column")
        bad = values.get("onbadrow", "fail").lower()
        if bad not in ("fail", "skip"):
            raise OptionError(f"onBadRow: expected fail or skip, got {values['onbadrow']!r}")
        batch = int(values.get("batchsize", DEFAULT_BATCH_SIZE))
        fail_after = values.get("failfirstattemptafterrows")
        return cls(servers, topic, bad == "skip", max(1, batch), int(fail_after) if fail_after else None,
                   ordered="message_group" in schema.fieldNames())


def _check_columns(schema: StructType) -> None:
    names = schema.fieldNames()
    if "body" not in names:
        raise OptionError(f"the dledger sink needs a body column (binary or string); the rows have "
                          f"{', '.join(names) or 'no columns'}")
    unknown = [n for n in names if n not in COLUMN_TYPES]
    if unknown:
        raise OptionError(f"the dledger sink does not know column{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)} (it takes {', '.join(COLUMN_TYPES)})")
    for field in schema.fields:
        if not isinstance(field.dataType, COLUMN_TYPES[field.name]):
            raise OptionError(f"column {field.name} is {field.dataType.simpleString()}; the dledger sink takes "
                              f"{' or '.join(t.__name__.replace('Type', '').lower() for t in COLUMN_TYPES[field.name])}")


@dataclass
class _Progress:
    sent: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    partition: int
    sent: int
    skipped: int


def is_bad_row(outcome: object) -> bool:
    """Whether a send's outcome condemns its row (onBadRow decides what then
    happens) rather than the task (which fails and is retried)."""
    return isinstance(outcome, BAD_ROW_ERRORS)


Outcomes = list[tuple[EncodedRow, Any]]   # each row sent, with its receipt or its ClientError


class _Writer:
    """What the batch and the stream writer share: rows -> messages -> the broker."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write_rows(self, rows: Iterable[Mapping[str, Any]], write_id: str, partition: int, attempt: int) -> SinkCommit:
        """Rows as dicts (tests, `bench.sink`'s path without Spark)."""
        return self.write_chunks(chunks_of_rows(rows, self.options.batch_size), write_id, partition, attempt)

    def write_batches(self, batches: Iterable[Any], write_id: str, partition: int, attempt: int) -> SinkCommit:
        """Spark's Arrow record batches."""
        return self.write_chunks(chunks_of_batches(batches, self.options.batch_size), write_id, partition, attempt)

    def write_chunks(self, chunks: Iterable[Chunk], write_id: str, partition: int, attempt: int) -> SinkCommit:
        from spark.live_log import _LoopThread

        return _LoopThread.run(self._send_all(chunks, write_id, partition, attempt))

    async def _send_all(self, chunks: Iterable[Chunk], write_id: str, partition: int, attempt: int) -> SinkCommit:
        """Each chunk encoded and sent as one call per topic, with up to
        CHUNKS_IN_FLIGHT chunks unanswered (one, when rows have a message
        group: a group's order across chunks is kept by sending them one
        after another): the calls stay full while the next rows are encoded."""
        from broker.client.producer import Producer

        progress = _Progress()
        in_flight: deque[asyncio.Future[Outcomes]] = deque()
        limit = 1 if self.options.ordered else CHUNKS_IN_FLIGHT
        async with Producer(self.options.servers) as producer:
            encoder = RowEncoder(self.options.topic, id_prefix(write_id, partition), producer.max_body_bytes,
                                 producer.config.namespace)
            try:
                for chunk in chunks:
                    encoded, refused = encoder.encode(chunk)
                    for row in refused:
                        progress.skipped += self._bad(row.topic, row.position, partition, row.error)
                    if encoded:
                        in_flight.append(asyncio.ensure_future(_send_chunk(producer, encoded)))
                    while len(in_flight) >= limit:
                        self._answered(await in_flight.popleft(), partition, progress, attempt)
                while in_flight:
                    self._answered(await in_flight.popleft(), partition, progress, attempt)
            finally:
                for sent in in_flight:  # a failure: what is still in flight is not waited for
                    sent.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)
        return SinkCommit(partition, progress.sent, progress.skipped)

    def _answered(self, outcomes: Outcomes, partition: int, progress: _Progress, attempt: int) -> None:
        """One chunk's receipts. A refused message (the broker's 4xx: bad
        topic, body, properties ...) is a bad row; anything else (the cluster
        unavailable past the client's retries, an unknown outcome) fails the
        task, whose retry sends the same message ids."""
        for row, result in outcomes:
            if is_bad_row(result):
                progress.skipped += self._bad(row.topic, row.position, partition, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                progress.sent += 1
            limit = self.options.fail_first_attempt_after
            if limit is not None and attempt == 0 and progress.sent >= limit:
                raise RuntimeError(f"failFirstAttemptAfterRows: attempt 0 of partition {partition} stops "
                                   f"after {progress.sent} rows, as asked")

    def _bad(self, topic: str | None, position: int, partition: int, error: Exception) -> int:
        text = f"row {position} of partition {partition} (topic {topic!r}): {error}"
        if not self.options.skip_bad_rows:
            raise BadRowError(f"{text} (onBadRow=skip counts and skips such rows)")
        log.warning("skipped %s", text)
        return 1


async def _send_chunk(producer: Any, rows: list[EncodedRow]) -> Outcomes:
    """A chunk's rows, a topic at a time, through the producer's send_prepared:
    its routing, call limits, retries with the same ids and leader following,
    without the accumulator's future per message (the chunk is already a batch)."""
    by_topic: dict[str, list[EncodedRow]] = {}
    for row in rows:
        by_topic.setdefault(row.topic, []).append(row)
    answers = await asyncio.gather(*(producer.send_prepared(topic, [row.wire for row in same_topic])
                                     for topic, same_topic in by_topic.items()))
    return [outcome for same_topic, answer in zip(by_topic.values(), answers) for outcome in zip(same_topic, answer)]


def _task() -> tuple[int, int]:
    from pyspark import TaskContext

    context = TaskContext.get()
    return (context.partitionId(), context.attemptNumber()) if context else (0, 0)


class DLedgerBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.writer = _Writer(options)
        self.write_id = uuid.uuid4().hex  # made once, on the driver: every task attempt of this write shares it

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition, attempt = _task()
        return self.writer.write_batches(iterator, self.write_id, partition, attempt)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        _log_totals(messages)


class DLedgerStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.writer = _Writer(options)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        # The query's id survives restarts (its checkpoint keeps it), and a
        # replayed micro-batch keeps its id: the same rows get the same ids.
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if not query or batch is None:
            raise RuntimeError("the dledger stream sink needs Spark's streaming query and batch ids")
        partition, attempt = _task()
        return self.writer.write_batches(iterator, f"{query}/{batch}", partition, attempt)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_totals(messages)


def _log_totals(messages: Sequence[WriterCommitMessage | None]) -> None:
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    skipped = sum(m.skipped for m in commits)
    log.info("dledger sink: %d messages sent, %d bad rows skipped", sum(m.sent for m in commits), skipped)
