"""The columns of the `dledger` data source, modelled on Spark's Kafka source.

Kafka gives (key, value, topic, partition, offset, timestamp, ...); a DLedger
log gives more: every committed entry has its Raft index and term, and a
message entry carries RocketMQ's stored record (topic, queue id, queue offset,
properties, two timestamps). One row per committed entry:

    index, term       the entry's place in the replicated log
    kind              "message" (a RocketMQ record), "system" (the store's
                      replicated metadata, store/system_entry.py) or "raw"
                      (any other body, e.g. `dledger append --data`)
    topic .. tags     the message's routing fields (null unless kind = message)
    properties        every message property, TAGS/KEYS/UNIQ_KEY included
    born_timestamp,
    store_timestamp   the producer's and the broker's clocks (ms precision)
    body              the message body; the JSON payload of a system entry;
                      the whole entry body of a raw one
    store_size, sys_flag, tags_code
                      what RocketMQ's dispatch (DispatchRequest) takes from a
                      record: its size, flag bits and the tag's Java hash, so
                      that ConsumeQueue units can be rebuilt from rows
    system_kind       the system entry's kind by name (CONSUMER_OFFSETS, ...)

physical_offset is the entry position + 48 (RocketMQ's CommitLog offset in
DLedger mode), the same on every replica.
"""
from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, DataType, IntegerType, LongType, MapType, StringType,
                               StructField, StructType, TimestampType)

KIND_MESSAGE: Final = "message"
KIND_SYSTEM: Final = "system"
KIND_RAW: Final = "raw"
KINDS: Final = (KIND_MESSAGE, KIND_SYSTEM, KIND_RAW)

SCHEMA: Final = StructType([
    StructField("index", LongType(), False),
    StructField("term", LongType(), False),
    StructField("kind", StringType(), False),
    StructField("topic", StringType(), True),
    StructField("queue_id", IntegerType(), True),
    StructField("queue_offset", LongType(), True),
    StructField("physical_offset", LongType(), False),
    StructField("message_id", StringType(), True),
    StructField("keys", ArrayType(StringType(), False), True),
    StructField("tags", StringType(), True),
    StructField("properties", MapType(StringType(), StringType(), False), True),
    StructField("born_timestamp", TimestampType(), True),
    StructField("store_timestamp", TimestampType(), True),
    StructField("body", BinaryType(), False),
    StructField("store_size", IntegerType(), False),
    StructField("sys_flag", IntegerType(), True),
    StructField("tags_code", LongType(), True),
    StructField("system_kind", StringType(), True),
])

COLUMNS: Final = tuple(SCHEMA.fieldNames())

# What PySpark checks a yielded RecordBatch against (pa.Schema.equals, field
# nullability included): derived from SCHEMA by PySpark's own conversion so the
# two can never drift apart.
ARROW_SCHEMA: Final[pa.Schema] = to_arrow_schema(SCHEMA, timezone="UTC")


def requested_columns(schema: StructType | None) -> tuple[str, ...] | None:
    """The columns a query asked for by giving its own schema (`.schema(...)`
    before `.load()`, a subset of SCHEMA): only those are decoded, so a query
    that leaves out `body` and `properties` never builds them. None: all.

    PySpark's Python data sources get no column pruning from the optimizer,
    so a schema is how a query says what it needs."""
    if schema is None or schema == SCHEMA:
        return None
    ours = {field.name: field for field in SCHEMA.fields}
    for field in schema.fields:
        if field.name not in ours:
            raise ValueError(f"schema: the dledger source has no column {field.name!r} "
                             f"(columns: {', '.join(COLUMNS)})")
        if _nullable(field.dataType) != _nullable(ours[field.name].dataType):
            raise ValueError(f"schema: column {field.name!r} is {ours[field.name].dataType.simpleString()}, "
                             f"not {field.dataType.simpleString()}")
    return tuple(field.name for field in schema.fields)


def arrow_schema_of(schema: StructType | None) -> pa.Schema:
    return ARROW_SCHEMA if schema is None or schema == SCHEMA else to_arrow_schema(schema, timezone="UTC")


def _nullable(data_type: DataType) -> DataType:
    """The type with every nested element nullable: a query's own schema may
    say ARRAY<STRING> for our ARRAY<STRING NOT NULL>."""
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type
