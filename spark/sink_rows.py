"""Rows for the `dledger` sink, a column at a time: Spark's Arrow batches (or
plain dicts) cut into chunks of batchSize rows, and each chunk's rows encoded
straight into the protocol's messages.

Why not a `Message` per row through the producer's `to_protocol`: on two
cores the sink competes with the brokers it writes to, so its CPU per row
is the rate. A row of the common shape (a body, maybe a topic and a tag)
is a copy of a per-topic template message with its body, id and tag set:
about a third of what building a `Message` and encoding it costs. A row
with keys, properties, a message group or a delivery time still goes
through `to_protocol`, the one encoder of those fields.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.client.errors import BadRequestError, PayloadTooLargeError
from broker.client.message import Message, to_protocol
from broker.client.producer import check_body
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

Columns = Mapping[str, Sequence[Any]]   # column name -> its values, one per row of the chunk
# Columns a row of the template's shape may have values in.
TEMPLATE_COLUMNS = frozenset({"body", "topic", "tags"})


def message_id(write_id: str, partition: int, row: int) -> str:
    """The RocketMQ 5 id of a row: 01 + 32 hex digits, 16 from a hash of the
    write and partition, 16 of the row's position in it: the same for every
    attempt of a task, different for every row (one hash per task, not per row)."""
    return row_id(id_prefix(write_id, partition), row)


@functools.lru_cache(maxsize=256)
def id_prefix(write_id: str, partition: int) -> str:
    return "01" + hashlib.sha256(f"{write_id}/{partition}".encode()).hexdigest()[:16].upper()


def row_id(prefix: str, row: int) -> str:
    return f"{prefix}{row:016X}"


class BadRowError(ValueError):
    """A row the sink refuses before sending it; the message names why."""


@dataclass(frozen=True)
class Chunk:
    first: int          # the position of its first row in the partition
    columns: Columns

    def __len__(self) -> int:
        return len(self.columns["body"])


class EncodedRow(NamedTuple):   # a tuple: one is made per row, and a frozen dataclass costs a microsecond
    position: int
    topic: str
    wire: pb.Message


@dataclass(frozen=True)
class RefusedRow:
    position: int
    topic: str | None
    error: Exception


def chunks_of_batches(batches: Iterable[Any], size: int) -> Iterator[Chunk]:
    """Spark's Arrow record batches as chunks of at most `size` rows (each
    slice is zero-copy; its columns become lists in C, pyarrow's to_pylist)."""
    position = 0
    for batch in batches:
        names = batch.schema.names
        for start in range(0, batch.num_rows, size):
            part = batch.slice(start, size)
            yield Chunk(position, {name: column.to_pylist() for name, column in zip(names, part.columns)})
            position += part.num_rows


def chunks_of_rows(rows: Iterable[Mapping[str, Any]], size: int) -> Iterator[Chunk]:
    """Rows given as dicts (tests, `bench.sink`'s path without Spark), as chunks."""
    position = 0
    pending: list[Mapping[str, Any]] = []
    for row in rows:
        pending.append(row)
        if len(pending) == size:
            yield _chunk(position, pending)
            position += size
            pending = []
    if pending:
        yield _chunk(position, pending)


def _chunk(first: int, rows: list[Mapping[str, Any]]) -> Chunk:
    names = {"body"}.union(*(row.keys() for row in rows))
    return Chunk(first, {name: [row.get(name) for row in rows] for name in names})


class RowEncoder:
    """One task's rows -> messages with their derived ids (see spark/sink.py)."""

    def __init__(self, default_topic: str | None, id_prefix: str, max_body_bytes: int, namespace: str = "") -> None:
        self.default_topic = default_topic
        self.id_prefix = id_prefix
        self.max_body_bytes = max_body_bytes
        self.namespace = namespace

    def encode(self, chunk: Chunk) -> tuple[list[EncodedRow], list[RefusedRow]]:
        now = time.time()   # the born time of the chunk's messages
        templates: dict[str, pb.Message] = {}
        columns = chunk.columns
        plain = all(all(v is None for v in values) for name, values in columns.items()
                    if name not in TEMPLATE_COLUMNS)
        topics = columns.get("topic") or [None] * len(chunk)
        tags = columns.get("tags") or [None] * len(chunk)
        encoded, refused = [], []
        for i, (body, topic, tag) in enumerate(zip(columns["body"], topics, tags)):
            position = chunk.first + i
            topic = topic or self.default_topic
            try:
                body = self._body(body, topic)
                message_id = row_id(self.id_prefix, position)
                if plain:
                    template = templates.get(topic)  # type: ignore[arg-type]
                    if template is None:
                        template = templates[topic] = self._template(topic, now)  # type: ignore[arg-type]
                    wire = pb.Message()
                    wire.CopyFrom(template)
                    wire.body = body
                    system = wire.system_properties
                    system.message_id = message_id
                    if tag is not None:
                        system.tag = tag
                else:
                    wire = to_protocol(self._message(columns, i, topic, body), message_id, self.namespace, now=now)  # type: ignore[arg-type]
            except (BadRowError, BadRequestError, PayloadTooLargeError) as error:
                refused.append(RefusedRow(position, topic, error))
                continue
            encoded.append(EncodedRow(position, topic, wire))  # type: ignore[arg-type]
        return encoded, refused

    def _body(self, body: Any, topic: str | None) -> bytes:
        if body is None:
            raise BadRowError("no body")
        if not topic:
            raise BadRowError("no topic (neither a topic column value nor the topic option)")
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            body = bytes(body)
        check_body(body, self.max_body_bytes)
        return body

    def _template(self, topic: str, now: float) -> pb.Message:
        """What every plain message of `topic` in one chunk shares."""
        return to_protocol(Message(topic=topic, body=b""), "", self.namespace, now=now)

    @staticmethod
    def _message(columns: Columns, i: int, topic: str, body: bytes) -> Message:
        def value(name: str) -> Any:
            values = columns.get(name)
            return values[i] if values is not None else None

        keys = value("keys")
        keys = [k for k in keys.split(" ") if k] if isinstance(keys, str) else list(keys or ())
        delivery = value("delivery_timestamp")
        if isinstance(delivery, int):
            delivery = datetime.datetime.fromtimestamp(delivery / 1000, datetime.timezone.utc)
        elif isinstance(delivery, datetime.datetime) and delivery.tzinfo is None:
            delivery = delivery.astimezone(datetime.timezone.utc)  # Spark hands back local naive times
        return Message(topic=topic, body=body, tag=value("tags"), keys=keys, properties=dict(value("properties") or {}),
                       message_group=value("message_group"), delivery_time=delivery)
