"""The `dledger` source's options, parsed and checked once, on the driver.

Spark passes options as a case-insensitive map of strings. The names follow
Spark's Kafka source where the idea is the same (startingOffsets,
endingOffsets, startingTimestamp, subscribePattern, minPartitions,
failOnDataLoss, max...PerTrigger) and say what they mean otherwise. An option
this source does not know, or two that contradict each other, is refused
with a message naming them: a typo must not silently read something else.

    path                  a node's data dir, its dledger-<id>/ dir, or a copy of data segments
    servers               HOST:PORT,... : read a running group instead (live mode)
    group                 DLedger group of the servers (default "default")
    nodeId                which dledger-<id>/ under path, when it holds several
    topic                 comma-separated topics: only messages of these (Kafka's subscribe)
    subscribePattern      a regular expression: only messages of the topics it matches whole
    startIndex, endIndex  first and last log index to read (batch; default: all committed)
    startingOffsets       earliest (batch default) | latest (stream default) | a log index |
                          JSON per topic and queue, {"Orders": {"0": 120, "1": -2}}: queue offsets
                          to start at, -2 earliest, -1 latest (streams: all -1 only, i.e. latest)
    endingOffsets         batch: latest (default) | JSON per topic and queue, queue offsets to stop
                          before (exclusive, as Kafka's), -1 latest
    startingTimestamp     ms since the epoch: only messages stored at or after it
    includeProperties     true (default) | false: leave the properties column out of the schema
    maxEntriesPerTrigger  stream: at most this many log entries per micro-batch
    maxPartitionBytes     file mode: bytes of log per partition (default 128 MiB)
    entriesPerPartition   live mode: entries per partition (default 100000)
    minPartitions         at least about this many partitions (default: the driver's cores)
    preferReplicas        live mode: true (default) reads from followers up to the committed
                          index pinned at planning; false: from the leader
    maxBytesPerSecond     live mode: throttle each partition's reads to this many bytes/s
    liveTransport         live mode: auto (default): raw runs sent from the nodes' files over their
                          HTTP (metrics) port where a node offers it (no TLS, no auth), else gRPC;
                          grpc: always the gRPC Read
    failOnDataLoss        stream: fail (default) or skip when retention deleted entries not yet read
    decode                arrow (default): RecordBatches to Spark; tuples: row by row (slower, for comparison)
    reader                batch (file or live mode): auto (default): the JVM reader when the session
                          has it (spark/jvm_reader.py) and it takes the options, else this Python
                          reader; jvm: the JVM reader or an error; python: this reader
    user, secretFile      live mode on a secured cluster: sign as this user, its secret the first line
                          of the file (every executor reads it; the plan carries the path, not the secret)
    tlsCa                 live mode: trust this CA and speak TLS
                          (all three default to DLEDGER_USER, DLEDGER_SECRET_FILE, DLEDGER_TLS_CA)

Per-queue JSON and startingTimestamp select rows after decoding (the whole
committed range is read); topic and subscribePattern too.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dledger.client import parse_servers
from dledger.rpc.credentials import ClientSecurity
from dledger.rpc.tls import TlsConfigError

DEFAULT_MAX_PARTITION_BYTES = 128 << 20  # Spark's spark.sql.files.maxPartitionBytes
DEFAULT_ENTRIES_PER_PARTITION = 100_000
# The planner runs on the driver: its cores are what local mode reads with.
DEFAULT_MIN_PARTITIONS = os.cpu_count() or 1
EARLIEST, LATEST = -2, -1  # Kafka's per-partition JSON values

# Every option, as documented (Spark hands them over lower-cased).
KNOWN_OPTIONS = ("path", "servers", "group", "nodeId", "topic", "subscribePattern", "startIndex", "endIndex",
                 "startingOffsets", "endingOffsets", "startingTimestamp", "includeProperties",
                 "maxEntriesPerTrigger", "maxPartitionBytes", "entriesPerPartition", "minPartitions",
                 "preferReplicas", "maxBytesPerSecond", "failOnDataLoss", "decode", "user", "secretFile", "tlsCa", "reader",
                 "liveTransport")
_CANONICAL = {name.lower(): name for name in KNOWN_OPTIONS}
FILE_ONLY = ("nodeId", "maxPartitionBytes")
LIVE_ONLY = ("entriesPerPartition", "preferReplicas", "maxBytesPerSecond", "user", "secretFile", "tlsCa",
             "liveTransport")
# Queue offsets per topic and queue id.
QueueOffsets = dict[str, dict[int, int]]


class OptionError(ValueError):
    """An option that cannot be used; the message names it."""


@dataclass(frozen=True)
class LiveAccess:
    """How live mode reaches a secured cluster: the user and the paths of
    its secret and of the CA (empty: DLEDGER_USER, DLEDGER_SECRET_FILE,
    DLEDGER_TLS_CA of the process). Partitions carry this to the executors,
    which read the files themselves: no secret in the plan."""
    user: str = ""
    secret_file: str = ""
    tls_ca: str = ""

    def security(self) -> ClientSecurity:
        try:
            return ClientSecurity.from_settings(self.user or None, self.secret_file or None, self.tls_ca or None)
        except (ValueError, TlsConfigError) as error:
            raise OptionError(f"user/secretFile/tlsCa: {error}") from None


@dataclass(frozen=True)
class SourceOptions:
    path: str | None
    servers: tuple[str, ...]
    group: str
    node_id: str | None
    topics: frozenset[str] | None
    start_index: int | None
    end_index: int | None
    starting_offsets: str  # earliest | latest | a log index | json (see starting_queue_offsets)
    max_entries_per_trigger: int | None
    max_partition_bytes: int
    entries_per_partition: int
    fail_on_data_loss: bool
    arrow: bool = True
    min_partitions: int = DEFAULT_MIN_PARTITIONS
    subscribe_pattern: str | None = None
    starting_queue_offsets: QueueOffsets | None = None
    ending_queue_offsets: QueueOffsets | None = None
    starting_timestamp: int | None = None
    include_properties: bool = True
    prefer_replicas: bool = True
    max_bytes_per_second: int | None = None
    starting_given: bool = False  # startingOffsets was set (else: the mode's default)
    access: LiveAccess = LiveAccess()
    reader: str = "auto"  # auto | jvm | python (the JVM provider reads the option; see spark/jvm)
    live_transport: str = "auto"  # auto | grpc: how raw runs are read (spark/raw_http.py, spark/jvm)

    @property
    def live(self) -> bool:
        return bool(self.servers)

    @property
    def selects_rows(self) -> bool:
        """Whether rows are chosen after decoding (pattern, queue offsets, timestamp)."""
        return bool(self.subscribe_pattern or self.starting_queue_offsets or self.ending_queue_offsets
                    or self.starting_timestamp is not None)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        values = {key.lower(): value for key, value in options.items()}
        _refuse_unknown(values)
        path = values.get("path") or None
        servers = _servers(values.get("servers"))
        if bool(path) == bool(servers):
            raise OptionError("give exactly one of a path (.load(PATH)) or the servers option")
        _refuse_contradictions(values, live=bool(servers))
        topics = frozenset(t.strip() for t in values.get("topic", "").split(",") if t.strip()) or None
        pattern = _pattern(values.get("subscribepattern"))
        starting_text = values.get("startingoffsets", "").strip()
        starting, starting_queues = _starting(starting_text)
        ending_queues = _queue_offsets("endingOffsets", values["endingoffsets"]) \
            if values.get("endingoffsets", "latest").strip().lower() != "latest" else None
        for name, queues in (("startingOffsets", starting_queues), ("endingOffsets", ending_queues)):
            _check_subscribed(name, queues, topics, pattern)
        if topics is None and pattern is None and (starting_queues or ending_queues):
            # The JSON's topics are the subscription, as with Kafka's assign.
            topics = frozenset((starting_queues or {}).keys()) | frozenset((ending_queues or {}).keys())
        if ending_queues and any(v == EARLIEST for q in ending_queues.values() for v in q.values()):
            raise OptionError("endingOffsets: -2 (earliest) cannot end a read; give -1 (latest) or an offset")
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
            subscribe_pattern=pattern,
            starting_queue_offsets=starting_queues,
            ending_queue_offsets=ending_queues,
            starting_timestamp=_optional_integer(values, "startingtimestamp", 0),
            include_properties=_boolean("includeProperties", values.get("includeproperties", "true")),
            prefer_replicas=_boolean("preferReplicas", values.get("preferreplicas", "true")),
            max_bytes_per_second=_optional_integer(values, "maxbytespersecond", 1),
            starting_given=bool(starting_text),
            access=_access(values),
            reader=_reader(values.get("reader", "auto")),
            live_transport=_choice("liveTransport", values.get("livetransport", "auto"), ("auto", "grpc")),
        )


def _access(values: Mapping[str, str]) -> LiveAccess:
    """The credentials and CA options, checked now (on the driver) so that a
    missing or unreadable file is an option error, not a task failure."""
    access = LiveAccess(values.get("user", "").strip(), values.get("secretfile", "").strip(),
                        values.get("tlsca", "").strip())
    access.security()
    return access


def _refuse_unknown(values: Mapping[str, str]) -> None:
    unknown = sorted(key for key in values if key not in _CANONICAL)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, list(_CANONICAL), n=1, cutoff=0.75)
        hints.append(f"{key!r}" + (f" (did you mean {_CANONICAL[close[0]]}?)" if close else ""))
    raise OptionError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                      f"the dledger source takes {', '.join(KNOWN_OPTIONS)}")


def _refuse_contradictions(values: Mapping[str, str], live: bool) -> None:
    def given(name: str) -> bool:
        return bool(values.get(name.lower(), "").strip())

    pairs = [("startIndex", "startingOffsets"), ("endIndex", "endingOffsets"), ("topic", "subscribePattern"),
             ("startingTimestamp", "startingOffsets"), ("startingTimestamp", "startIndex")]
    for first, second in pairs:
        if given(first) and given(second):
            raise OptionError(f"options {first} and {second} contradict each other: give one of them")
    wrong_mode = [name for name in (FILE_ONLY if live else LIVE_ONLY) if given(name)]
    if wrong_mode:
        raise OptionError(f"option{'s' if len(wrong_mode) > 1 else ''} {', '.join(wrong_mode)} only appl"
                          f"{'y' if len(wrong_mode) > 1 else 'ies'} to {'file' if live else 'live'} mode "
                          f"({'a path' if live else 'the servers option'}), not to {'live' if live else 'file'} "
                          f"mode")


def _starting(text: str) -> tuple[str, QueueOffsets | None]:
    """(earliest | latest | index | json, per-queue offsets for json)."""
    lowered = text.lower()
    if lowered in ("", "earliest", "latest"):
        return lowered or "latest", None
    if text.startswith("{"):
        return "json", _queue_offsets("startingOffsets", text)
    _integer("startingOffsets", text, 0)
    return text, None


def _queue_offsets(name: str, text: str) -> QueueOffsets:
    """Kafka's per-partition JSON with RocketMQ's names: {"topic": {"queue id": offset}}."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"{name}: not JSON ({error}); expected e.g. {{\"Orders\": {{\"0\": 120, \"1\": -2}}}}") \
            from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"{name}: expected a JSON object of topics, e.g. {{\"Orders\": {{\"0\": 120}}}}")
    result: QueueOffsets = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict) or not queues:
            raise OptionError(f"{name}: topic {topic!r} needs an object of queue id -> offset")
        result[topic] = {}
        for queue, offset in queues.items():
            try:
                queue_id = int(queue)
            except ValueError:
                raise OptionError(f"{name}: topic {topic!r}: queue id {queue!r} is not an integer") from None
            if queue_id < 0 or not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(f"{name}: topic {topic!r} queue {queue}: expected a queue id >= 0 and an "
                                  f"offset >= 0, -2 (earliest) or -1 (latest), got {offset!r}")
            result[topic][queue_id] = offset
    return result


def _check_subscribed(name: str, queues: QueueOffsets | None, topics: frozenset[str] | None,
                      pattern: str | None) -> None:
    if not queues:
        return
    outside = [t for t in queues if (topics is not None and t not in topics)
               or (pattern is not None and not re.fullmatch(pattern, t))]
    if outside:
        raise OptionError(f"{name} names topic{'s' if len(outside) > 1 else ''} {', '.join(map(repr, outside))} "
                          f"that the topic/subscribePattern option does not subscribe to")


def _pattern(text: str | None) -> str | None:
    if not text:
        return None
    try:
        re.compile(text)
    except re.error as error:
        raise OptionError(f"subscribePattern: not a regular expression ({error})") from None
    return text


def _servers(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        return tuple(parse_servers(text))
    except ValueError as error:
        raise OptionError(f"servers: {error}") from None


def _optional_integer(values: Mapping[str, str], key: str, minimum: int) -> int | None:
    text = values.get(key)
    return None if text is None or text == "" else _integer(_CANONICAL.get(key, key), text, minimum)


def _integer(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise OptionError(f"{name}: expected at least {minimum}, got {value}")
    return value


def _reader(text: str) -> str:
    return _choice("reader", text, ("auto", "jvm", "python"))


def _choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    lowered = text.strip().lower() or choices[0]
    if lowered not in choices:
        raise OptionError(f"{name}: expected {', '.join(choices[:-1])} or {choices[-1]}, got {text!r}")
    return lowered


def _decode(text: str) -> bool:
    if text.lower() not in ("arrow", "tuples"):
        raise OptionError(f"decode: expected arrow or tuples, got {text!r}")
    return text.lower() == "arrow"


def _boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"{name}: expected true or false, got {text!r}")
    return lowered == "true"
