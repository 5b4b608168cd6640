"""Committed entries -> Arrow RecordBatches in the data source's schema.

Spark gets RecordBatches, never tuples: PySpark's tuple path converts every
value of every row in Python, which costs more than the decoding itself.
Within a batch each row is one tuple appended to a list, and the columns are
cut out with zip(*rows) (C speed) when the batch is full; bodies go to Arrow
as one joined buffer plus offsets, the cheapest copy Arrow offers.

A message record with IPv4 hosts (what a broker writes) is read with one
struct call for all its fixed fields; anything else goes through
store.codec.peek, which also says precisely what is wrong with a bad record.
The RocketMQ body CRC is not recomputed: the entry's body CRC, checked by the
scan, covers every byte of the record.
"""
from __future__ import annotations

import datetime
import itertools
import struct
from collections.abc import Iterable, Iterator
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from dledger.entry import MAGIC_NORMAL
from spark.entry_scan import MAGIC_CLIENT_NORMAL
from store import message_const as mc
from store.codec import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, peek
from store.errors import MessageDecodeError
from store.java_hash import tag_hash_code
from store.system_entry import SYSTEM_MAGIC_CODE, SystemKind, decode_system_entry
from spark.schema import ARROW_SCHEMA, KIND_MESSAGE, KIND_RAW, KIND_SYSTEM

# Rows per RecordBatch: big enough to amortize the per-array cost, small
# enough that a batch of 1 KiB messages stays near 4 MB.
BATCH_ROWS: Final = 4096
# ... or this many body bytes, whichever comes first: Arrow's binary offsets
# are int32, and a batch of 4 MiB bodies must stay far below 2 GiB.
BATCH_BYTES: Final = 32 << 20
BODY_START: Final = 48  # a message's physical offset is its entry's pos + 48

# TOTALSIZE .. BODY length of a record whose born and store hosts are IPv4.
_FIXED_V4 = struct.Struct(">iiiiiqqiq4siq4siiqi")
_V6_BITS = mc.BORNHOST_V6_FLAG | mc.STOREHOSTADDRESS_V6_FLAG
_SIZE_MAGIC = struct.Struct(">ii")
_USHORT = struct.Struct(">H")
_SHORT = struct.Struct(">h")
_SYSTEM_HEADER_SIZE = 10  # TOTALSIZE, MAGIC, KIND (store/system_entry.py)

_KEYS_TYPE = ARROW_SCHEMA.field("keys").type
_PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type
# The columns a row tuple holds, in tuple order; the others are derived per batch.
_ROW_COLUMNS: Final = ("index", "term", "kind", "topic", "queue_id", "queue_offset", "physical_offset",
                       "born_timestamp", "store_timestamp", "body", "store_size", "sys_flag", "system_kind")
_TYPES: Final = {field.name: field.type for field in ARROW_SCHEMA}
_TAGS = pa.scalar(mc.TAGS)
_KEYS = pa.scalar(mc.KEYS)
_UNIQ_KEY = pa.scalar(mc.UNIQ_KEY)


def system_kind_name(kind: int) -> str:
    try:
        return SystemKind(kind).name
    except ValueError:
        return f"BROKER_{kind}" if kind >= SystemKind.BROKER_BASE else f"KIND_{kind}"


def parse_message(body: memoryview) -> tuple[Any, ...]:
    """(topic, queue_id, queue_offset, sys_flag, born ms, stored ms, body start,
    body end, properties text) of the one record in `body`, or MessageDecodeError."""
    if len(body) >= _FIXED_V4.size:
        fields = _FIXED_V4.unpack_from(body)
        if not fields[7] & _V6_BITS:
            parsed = _parse_v4(body, fields)
            if parsed is not None:
                return parsed
    request = peek(body)
    if request.msg_size != len(body):
        raise MessageDecodeError(f"the record says {request.msg_size} bytes but the entry holds {len(body)}")
    start = request.body_offset
    text = "".join([f"{name}\x01{value}\x02" for name, value in request.properties.items()])
    return (request.topic, request.queue_id, request.queue_offset, request.sys_flag, request.born_timestamp,
            request.store_timestamp, start, start + request.body_length, text)


def _parse_v4(body: memoryview, fields: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The fast path; None when anything is off (peek then explains it)."""
    total = fields[0]
    body_end = _FIXED_V4.size + fields[16]
    if total != len(body) or fields[16] < 0 or body_end + 3 > total:
        return None
    if fields[1] == MESSAGE_MAGIC_CODE:
        topic_start = body_end + 1
        topic_end = topic_start + body[body_end]
    else:
        topic_start = body_end + 2
        topic_end = topic_start + _USHORT.unpack_from(body, body_end)[0]
    if topic_end + 2 > total or topic_end == topic_start or \
            topic_end + 2 + _SHORT.unpack_from(body, topic_end)[0] != total:
        return None
    try:
        topic = str(body[topic_start:topic_end], "utf-8")
        text = str(body[topic_end + 2:total], "utf-8")
    except UnicodeDecodeError:
        return None
    return topic, fields[3], fields[5], fields[7], fields[8], fields[11], _FIXED_V4.size, body_end, text


def _property_count(text: str) -> int:
    """How many name\\x01value pairs `text` holds, or -1 when it is malformed."""
    pairs = text.count("\x01")
    separators = text.count("\x02")
    if separators != pairs and not (separators == pairs - 1 and text[-1] != "\x02"):
        return -1
    return pairs


class RowBatchBuilder:
    """Accumulates rows; `add` returns a RecordBatch each time one is full.

    Per row, Python does only what needs the record's framing: the fixed
    fields, the topic, the body slice and the raw properties text. Splitting
    properties into the map column, and the tags, message id and keys columns
    taken from it, happen once per batch in Arrow (see `flush`)."""

    def __init__(self, topics: frozenset[str] | None = None, batch_rows: int = BATCH_ROWS) -> None:
        self.topics = topics
        self.batch_rows = batch_rows
        self._tag_codes: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.bytes = 0
        self.property_texts: list[str] = []
        self.property_counts: list[int] = []

    def add(self, index: int, term: int, pos: int, body: memoryview) -> pa.RecordBatch | None:
        """Decode one committed NORMAL entry's body; None while the batch fills."""
        magic = _SIZE_MAGIC.unpack_from(body)[1] if len(body) >= _SIZE_MAGIC.size else 0
        if magic == MESSAGE_MAGIC_CODE or magic == MESSAGE_MAGIC_CODE_V2:
            self._add_message(index, term, pos, body)
        elif magic == SYSTEM_MAGIC_CODE:
            self._add_system(index, term, pos, body)
        else:
            self._add_other(index, term, pos, KIND_RAW, body, len(body), None)
        self.bytes += len(body)
        if len(self.rows) >= self.batch_rows or self.bytes >= BATCH_BYTES:
            return self.flush()
        return None

    def extend(self, entries: Iterable[tuple[int, int, int, int, memoryview]]) -> Iterator[pa.RecordBatch]:
        """The hot loop over (index, term, pos, entry magic, body) from the
        scan: NORMAL entries only; a V1 record with IPv4 hosts (what a broker
        writes) is taken apart right here, anything else goes through `add`.
        One frame per row instead of five is a quarter of the decoding time."""
        unpack_fixed, fixed_size, unpack_short = _FIXED_V4.unpack_from, _FIXED_V4.size, _SHORT.unpack_from
        topics, batch_rows = self.topics, self.batch_rows
        for index, term, pos, entry_magic, body in entries:
            if entry_magic != MAGIC_NORMAL:
                if entry_magic == MAGIC_CLIENT_NORMAL:
                    self._add_other(index, term, pos, KIND_RAW, body, len(body), None)
                    self.bytes += len(body)
                    if len(self.rows) >= batch_rows or self.bytes >= BATCH_BYTES:
                        yield self.flush()  # type: ignore[misc]
                continue
            size = len(body)
            done = False
            if size >= fixed_size:
                f = unpack_fixed(body)
                body_end = fixed_size + f[16]
                if f[1] == MESSAGE_MAGIC_CODE and f[0] == size and not f[7] & _V6_BITS and \
                        fixed_size <= body_end and body_end + 3 <= size:
                    topic_end = body_end + 1 + body[body_end]
                    if body_end + 1 < topic_end <= size - 2 and topic_end + 2 + unpack_short(body, topic_end)[0] == size:
                        try:
                            topic = str(body[body_end + 1:topic_end], "utf-8")
                            text = str(body[topic_end + 2:size], "utf-8")
                        except UnicodeDecodeError:
                            count = -1  # malformed: `add` will say so
                        else:
                            count = _property_count(text) if text else 0
                        if count >= 0:
                            done = True
                            if topics is None or topic in topics:
                                if count:
                                    self.property_texts.append(text[:-1] if text[-1] == "\x02" else text)
                                self.property_counts.append(count)
                                self.rows.append((index, term, KIND_MESSAGE, topic, f[3], f[5], pos + BODY_START,
                                                  f[8] * 1000, f[11] * 1000, body[fixed_size:body_end], size, f[7],
                                                  None))
                                self.bytes += size
                                if len(self.rows) >= batch_rows or self.bytes >= BATCH_BYTES:
                                    yield self.flush()  # type: ignore[misc]
            if not done:
                batch = self.add(index, term, pos, body)
                if batch is not None:
                    yield batch
        last = self.flush()
        if last is not None:
            yield last

    def _add_message(self, index: int, term: int, pos: int, body: memoryview) -> None:
        try:
            topic, queue_id, queue_offset, sys_flag, born, stored, start, end, text = parse_message(body)
        except MessageDecodeError:
            parsed = None
        else:
            count = _property_count(text) if text else 0
            parsed = count >= 0
        if not parsed:
            # The entry's CRC held, so these are the bytes a client appended:
            # not a RocketMQ record after all, but data all the same.
            self._add_other(index, term, pos, KIND_RAW, body, len(body), None)
            return
        if self.topics is not None and topic not in self.topics:
            return
        if count:
            self.property_texts.append(text[:-1] if text[-1] == "\x02" else text)
        self.property_counts.append(count)
        self.rows.append((index, term, KIND_MESSAGE, topic, queue_id, queue_offset, pos + BODY_START,
                          born * 1000, stored * 1000, body[start:end], len(body), sys_flag, None))

    def _add_system(self, index: int, term: int, pos: int, body: memoryview) -> None:
        try:
            entry = decode_system_entry(body)
        except MessageDecodeError:
            self._add_other(index, term, pos, KIND_RAW, body, len(body), None)
            return
        # The body column holds the JSON payload: what a reader wants.
        self._add_other(index, term, pos, KIND_SYSTEM, body[_SYSTEM_HEADER_SIZE:], len(body),
                        system_kind_name(entry.kind))

    def _add_other(self, index: int, term: int, pos: int, kind: str, payload: memoryview, size: int,
                   system_kind: str | None) -> None:
        if self.topics is not None:
            return  # a topic filter keeps messages of those topics only
        self.property_counts.append(-1)
        self.rows.append((index, term, kind, None, None, None, pos + BODY_START, None, None, payload, size,
                          None, system_kind))

    def flush(self) -> pa.RecordBatch | None:
        """The rows gathered so far as one RecordBatch (None when there are none)."""
        if not self.rows:
            return None
        columns = list(zip(*self.rows))
        arrays = {name: (_binary(columns[at]) if name == "body" else pa.array(columns[at], _TYPES[name]))
                  for at, name in enumerate(_ROW_COLUMNS)}
        properties = self._properties_array()
        arrays["properties"] = properties
        arrays["tags"] = pc.map_lookup(properties, _TAGS, "first")
        arrays["message_id"] = pc.map_lookup(properties, _UNIQ_KEY, "first")
        arrays["keys"] = keys_from_raw(pc.map_lookup(properties, _KEYS, "first"))
        arrays["tags_code"] = self._tags_codes(arrays["tags"], arrays["kind"])
        batch = pa.RecordBatch.from_arrays([arrays[name] for name in ARROW_SCHEMA.names], schema=ARROW_SCHEMA)
        self._reset()
        return batch

    def _properties_array(self) -> pa.Array:
        """All rows' properties split at once: the texts joined with the pair
        separator make one alternating name, value, name, value ... list."""
        parts = "\x02".join(self.property_texts).replace("\x01", "\x02").split("\x02") \
            if self.property_texts else []
        offsets = list(itertools.accumulate((max(0, c) for c in self.property_counts), initial=0))
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(parts[0::2], pa.string()),
            pa.array(parts[1::2], pa.string()), type=_PROPERTIES_TYPE,
            mask=pa.array([c < 0 for c in self.property_counts], pa.bool_()))

    def _tags_codes(self, tags: pa.Array, kinds: pa.Array) -> pa.Array:
        """Java hash of each distinct tag (cached across batches); 0 for a
        message without tags (RocketMQ's tagsCode), null for other rows."""
        encoded = pc.dictionary_encode(tags)
        distinct = encoded.dictionary.to_pylist()
        for tag in distinct:
            if tag not in self._tag_codes:
                self._tag_codes[tag] = tag_hash_code(tag)
        codes = pa.array([self._tag_codes[tag] for tag in distinct], pa.int64()).take(encoded.indices)
        return pc.if_else(pc.and_(pc.equal(kinds, KIND_MESSAGE), pc.is_null(codes)), 0, codes)


def keys_from_raw(raw: pa.Array) -> pa.Array:
    """KEYS split on spaces, empty keys dropped (as the IndexService splits them)."""
    split = pc.split_pattern(raw, mc.KEY_SEPARATOR)
    if not pc.any(pc.equal(pc.list_flatten(split), "")).as_py():
        return split.cast(_KEYS_TYPE)
    return pa.array([None if keys is None else [key for key in keys.split(mc.KEY_SEPARATOR) if key]
                     for keys in raw.to_pylist()], _KEYS_TYPE)


def _binary(values: tuple[memoryview, ...]) -> pa.Array:
    """A binary array from byte slices: one join and an offsets buffer
    (pa.array over memoryviews costs about five times more)."""
    offsets = pa.array(list(itertools.accumulate(map(len, values), initial=0)), pa.int32())
    return pa.Array.from_buffers(pa.binary(), len(values), [None, offsets.buffers()[1],
                                                           pa.py_buffer(b"".join(values))])


def record_batches(entries: Iterable[tuple[int, int, int, memoryview]],
                   topics: frozenset[str] | None = None,
                   batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """(index, term, pos, body) of committed NORMAL entries -> RecordBatches."""
    return RowBatchBuilder(topics, batch_rows).extend(
        (index, term, pos, MAGIC_NORMAL, body) for index, term, pos, body in entries)


def scanned_record_batches(entries: Iterable[tuple[int, int, int, int, memoryview]],
                           topics: frozenset[str] | None = None) -> Iterator[pa.RecordBatch]:
    """(index, term, pos, magic, body) straight from the file scan -> RecordBatches
    of its NORMAL entries (no intermediate generator on the hot path)."""
    return RowBatchBuilder(topics).extend(entries)



def record_tuples(entries: Iterable[tuple[int, int, int, int, memoryview]],
                  topics: frozenset[str] | None = None) -> Iterator[tuple[Any, ...]]:
    """The same rows as plain tuples from (index, term, pos, magic, body) as
    the scan hands them on, decoded one at a time: PySpark's row-by-row path
    (option decode=tuples), kept so that the benchmark can show what the
    Arrow path saves."""
    tag_codes: dict[str | None, int] = {}
    for index, term, pos, entry_magic, body in entries:
        if entry_magic != MAGIC_NORMAL and entry_magic != MAGIC_CLIENT_NORMAL:
            continue
        magic = _SIZE_MAGIC.unpack_from(body)[1] if len(body) >= _SIZE_MAGIC.size and entry_magic == MAGIC_NORMAL \
            else 0
        message = None
        if magic == MESSAGE_MAGIC_CODE or magic == MESSAGE_MAGIC_CODE_V2:
            try:
                message = parse_message(body)
            except MessageDecodeError:
                pass
        if message is not None:
            topic, queue_id, queue_offset, sys_flag, born, stored, start, end, text = message
            if topics is not None and topic not in topics:
                continue
            properties = dict(item.split("\x01", 1) for item in text.split("\x02") if item)
            tags, keys = properties.get(mc.TAGS), properties.get(mc.KEYS)
            if tags not in tag_codes:
                tag_codes[tags] = tag_hash_code(tags)
            yield (index, term, KIND_MESSAGE, topic, queue_id, queue_offset, pos + BODY_START,
                   properties.get(mc.UNIQ_KEY), None if keys is None else [k for k in keys.split(" ") if k], tags,
                   properties, _datetime(born), _datetime(stored), bytes(body[start:end]), len(body), sys_flag,
                   tag_codes[tags], None)
        elif topics is None:
            system = magic == SYSTEM_MAGIC_CODE
            kind_name = system_kind_name(decode_system_entry(body).kind) if system else None
            payload = body[_SYSTEM_HEADER_SIZE:] if system else body
            yield (index, term, KIND_SYSTEM if system else KIND_RAW, None, None, None, pos + BODY_START, None, None,
                   None, None, None, None, bytes(payload), len(body), None, None, kind_name)


def _datetime(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
