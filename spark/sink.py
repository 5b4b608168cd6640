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
turns them into messages a column at a time and keeps up to
BATCHES_IN_FLIGHT batches of batchSize sent and unanswered.

Options: servers (required), topic (default topic), onBadRow (fail | skip),
batchSize (messages per batch, default 500), failFirstAttemptAfterRows
(fault injection for tests: attempt 0 of each task fails once that many rows
are sent).
"""
from __future__ import annotations

import asyncio
import datetime
import functools
import hashlib
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (ArrayType, BinaryType, LongType, MapType, StringType, StructType, TimestampType)

from broker.client.errors import BadRequestError, NotFoundError, PayloadTooLargeError
from broker.client.message import Message
from dledger.client import parse_servers
from spark.options import OptionError

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500
# What the broker (or the client's own check) says about one message: the
# row is at fault. Every other error (unavailable past the client's retries,
# an unknown outcome, forbidden) is the task's, which fails and is retried.
BAD_ROW_ERRORS = (BadRequestError, NotFoundError, PayloadTooLargeError)
# Batches sent and not yet answered, per task: enough to keep the producer's
# calls (4 in flight, broker/client/producer.py) full.
BATCHES_IN_FLIGHT = 4
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
        return cls(servers, topic, bad == "skip", max(1, batch), int(fail_after) if fail_after else None)


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
class _SentBatch:
    items: list[tuple[int, Any]]            # (row position, message)
    futures: list["asyncio.Future[Any]"]


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    partition: int
    sent: int
    skipped: int


class BadRowError(ValueError):
    """A row the broker (or the sink) refuses; the message names it."""


def is_bad_row(outcome: object) -> bool:
    """Whether a send's outcome condemns its row (onBadRow decides what then
    happens) rather than the task (which fails and is retried)."""
    return isinstance(outcome, BAD_ROW_ERRORS)


def message_id(write_id: str, partition: int, row: int) -> str:
    """The RocketMQ 5 id of a row: 01 + 32 hex digits, 16 from a hash of the
    write and partition, 16 of the row's position in it: the same for every
    attempt of a task, different for every row (one hash per task, not per row)."""
    return f"{_id_prefix(write_id, partition)}{row:016X}"


@functools.lru_cache(maxsize=256)
def _id_prefix(write_id: str, partition: int) -> str:
    return "01" + hashlib.sha256(f"{write_id}/{partition}".encode()).hexdigest()[:16].upper()


class _Writer:
    """What the batch and the stream writer share: rows -> messages -> the broker."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write_rows(self, rows: Iterable[Mapping[str, Any]], write_id: str, partition: int, attempt: int) -> SinkCommit:
        from spark.live_log import _LoopThread

        return _LoopThread.run(self._send_all(rows, write_id, partition, attempt))

    async def _send_all(self, rows: Iterable[Mapping[str, Any]], write_id: str, partition: int,
                        attempt: int) -> SinkCommit:
        """Rows -> messages, `batch_size` at a time, with up to
        BATCHES_IN_FLIGHT batches sent and not yet answered: the producer's
        calls stay full while the next rows are turned into messages."""
        from broker.client.producer import Producer

        progress = _Progress()
        in_flight: deque[_SentBatch] = deque()
        async with Producer(self.options.servers) as producer:
            try:
                batch: list[tuple[int, Any]] = []
                for position, row in enumerate(rows):
                    try:
                        message = self._message(row, write_id, partition, position)
                        producer.check(message)
                    except (BadRowError, *BAD_ROW_ERRORS) as error:
                        topic = row.get("topic") or self.options.topic
                        progress.skipped += self._bad(topic, position, partition, error)
                        continue
                    batch.append((position, message))
                    if len(batch) >= self.options.batch_size:
                        in_flight.append(_SentBatch(batch, producer.send_many([m for _, m in batch])))
                        batch = []
                        while len(in_flight) >= BATCHES_IN_FLIGHT:
                            await self._answered(in_flight.popleft(), partition, progress, attempt)
                if batch:
                    in_flight.append(_SentBatch(batch, producer.send_many([m for _, m in batch])))
                while in_flight:
                    await self._answered(in_flight.popleft(), partition, progress, attempt)
            finally:
                for sent in in_flight:  # a failure: what is still in flight is not waited for
                    for future in sent.futures:
                        future.cancel()
        return SinkCommit(partition, progress.sent, progress.skipped)

    async def _answered(self, sent: "_SentBatch", partition: int, progress: "_Progress", attempt: int) -> None:
        """Wait for one batch's receipts. A refused message (the broker's
        4xx: bad topic, body, properties ...) is a bad row; anything else
        (the cluster unavailable past the client's retries, an unknown
        outcome) fails the task, whose retry sends the same message ids."""
        results = await asyncio.gather(*sent.futures, return_exceptions=True)
        for (position, message), result in zip(sent.items, results):
            if is_bad_row(result):
                progress.skipped += self._bad(message.topic, position, partition, result)
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

    def _message(self, row: Mapping[str, Any], write_id: str, partition: int, position: int) -> Message:
        body = row.get("body")
        if body is None:
            raise BadRowError("no body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        topic = row.get("topic") or self.options.topic
        if not topic:
            raise BadRowError("no topic (neither a topic column value nor the topic option)")
        keys = row.get("keys")
        keys = [k for k in keys.split(" ") if k] if isinstance(keys, str) else list(keys or ())
        delivery = row.get("delivery_timestamp")
        if isinstance(delivery, int):
            delivery = datetime.datetime.fromtimestamp(delivery / 1000, datetime.timezone.utc)
        elif isinstance(delivery, datetime.datetime) and delivery.tzinfo is None:
            delivery = delivery.astimezone(datetime.timezone.utc)  # Spark hands back local naive times
        return Message(topic=topic, body=bytes(body), tag=row.get("tags"), keys=keys,
                       properties=dict(row.get("properties") or {}), message_group=row.get("message_group"),
                       delivery_time=delivery, message_id=message_id(write_id, partition, position))


def _task() -> tuple[int, int]:
    from pyspark import TaskContext

    context = TaskContext.get()
    return (context.partitionId(), context.attemptNumber()) if context else (0, 0)


def rows_of(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The rows of Spark's Arrow batches as dicts, built a column at a time
    (pyarrow's to_pylist, in C): cheaper than the Row objects PySpark makes
    for a row writer, each value through a converter."""
    for batch in batches:
        names = batch.schema.names
        for values in zip(*(column.to_pylist() for column in batch.columns)):
            yield dict(zip(names, values))


class DLedgerBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.writer = _Writer(options)
        self.write_id = uuid.uuid4().hex  # made once, on the driver: every task attempt of this write shares it

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition, attempt = _task()
        return self.writer.write_rows(rows_of(iterator), self.write_id, partition, attempt)

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
        return self.writer.write_rows(rows_of(iterator), f"{query}/{batch}", partition, attempt)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log_totals(messages)


def _log_totals(messages: Sequence[WriterCommitMessage | None]) -> None:
    commits = [m for m in messages if isinstance(m, SinkCommit)]
    skipped = sum(m.skipped for m in commits)
    log.info("dledger sink: %d messages sent, %d bad rows skipped", sum(m.sent for m in commits), skipped)
