"""The `dledger` source's options, parsed and checked once, on the driver.

Spark passes options as a case-insensitive map of strings. The names follow
Spark's Kafka source where the idea is the same (startingOffsets,
failOnDataLoss, max...PerTrigger) and say what they mean otherwise.

    path                  a node's data dir, its dledger-<id>/ dir, or a copy of data segments
    servers               HOST:PORT,... : read a running group instead (live mode)
    group                 DLedger group of the servers (default "default")
    nodeId                which dledger-<id>/ under path, when it holds several
    topic                 comma-separated topics: only messages of these (like Kafka's subscribe)
    startIndex, endIndex  batch: first and last log index to read (default: all committed)
    startingOffsets       stream: earliest | latest (default) | a log index to start at
    maxEntriesPerTrigger  stream: at most this many log entries per micro-batch
    maxPartitionBytes     file mode: bytes of log per partition (default 128 MiB)
    entriesPerPartition   live mode: entries per partition (default 100000)
    failOnDataLoss        stream: fail (default) or skip when retention deleted entries not yet read
    decode                arrow (default): RecordBatches to Spark; tuples: row by row (slower, for comparison)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dledger.client import parse_servers

DEFAULT_MAX_PARTITION_BYTES = 128 << 20  # Spark's spark.sql.files.maxPartitionBytes
DEFAULT_ENTRIES_PER_PARTITION = 100_000
# The planner runs on the driver: its cores are what local mode reads with.
DEFAULT_MIN_PARTITIONS = os.cpu_count() or 1


class OptionError(ValueError):
    """An option that cannot be used; the message names it."""


@dataclass(frozen=True)
class SourceOptions:
    path: str | None
    servers: tuple[str, ...]
    group: str
    node_id: str | None
    topics: frozenset[str] | None
    start_index: int | None
    end_index: int | None
    starting_offsets: str
    max_entries_per_trigger: int | None
    max_partition_bytes: int
    entries_per_partition: int
    fail_on_data_loss: bool
    arrow: bool = True
    min_partitions: int = DEFAULT_MIN_PARTITIONS

    @property
    def live(self) -> bool:
        return bool(self.servers)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        values = {key.lower(): value for key, value in options.items()}
        path = values.get("path") or None
        servers = _servers(values.get("servers"))
        if bool(path) == bool(servers):
            raise OptionError("give exactly one of a path (.load(PATH)) or the servers option")
        topics = frozenset(t.strip() for t in values.get("topic", "").split(",") if t.strip()) or None
        starting = values.get("startingoffsets", "latest").strip().lower()
        if starting not in ("earliest", "latest"):
            _integer("startingOffsets", starting, 0)
        return cls(
            path=path, servers=servers, group=values.get("group", "default"),
            node_id=values.get("nodeid") or None, topics=topics,
            start_index=_optional_integer(values, "startindex", 0),
            end_index=_optional_integer(values, "endindex", -1),
            starting_offsets=starting,
            max_entries_per_trigger=_optional_integer(values, "maxentriespertrigger", 1),
            max_partition_bytes=_optional_integer(values, "maxpartitionbytes", 1) or DEFAULT_MAX_PARTITION_BYTES,
            entries_per_partition=_optional_integer(values, "entriesperpartition", 1)
            or DEFAULT_ENTRIES_PER_PARTITION,
            fail_on_data_loss=_boolean("failOnDataLoss", values.get("failondataloss", "true")),
            arrow=_decode(values.get("decode", "arrow")),
            min_partitions=_optional_integer(values, "minpartitions", 1) or DEFAULT_MIN_PARTITIONS,
        )


def _servers(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        return tuple(parse_servers(text))
    except ValueError as error:
        raise OptionError(f"servers: {error}") from None


def _optional_integer(values: Mapping[str, str], key: str, minimum: int) -> int | None:
    text = values.get(key)
    return None if text is None or text == "" else _integer(key, text, minimum)


def _integer(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise OptionError(f"{name}: expected at least {minimum}, got {value}")
    return value


def _decode(text: str) -> bool:
    if text.lower() not in ("arrow", "tuples"):
        raise OptionError(f"decode: expected arrow or tuples, got {text!r}")
    return text.lower() == "arrow"


def _boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"{name}: expected true or false, got {text!r}")
    return lowered == "true"
