"""RocketMQ's stored message layout: the record RocketMQ writes into its CommitLog.

In DLedger mode one such record is the whole body of one DLedger entry. All
integers are big-endian; positions are from the start of the record:

    pos  size  field
      0     4  TOTALSIZE                  length of the whole record
      4     4  MAGICCODE                  MESSAGE_MAGIC_CODE (V1) or _V2
      8     4  BODYCRC                    crc32(body) & 0x7FFFFFFF (java.util.zip.CRC32, sign bit cleared)
     12     4  QUEUEID
     16     4  FLAG                       the producer's flag, opaque to the broker
     20     8  QUEUEOFFSET                the message's ConsumeQueue offset
     28     8  PHYSICALOFFSET             the message's CommitLog offset (DLedger: entry pos + 48)
     36     4  SYSFLAG                    message_const.*_FLAG / *_TYPE bits
     40     8  BORNTIMESTAMP              ms since the epoch, set by the producer
     48  8|20  BORNHOST                   IPv4 + port int32, or IPv6 + port when BORNHOST_V6_FLAG
      .     8  STORETIMESTAMP             ms since the epoch, set by the broker that stored it
      .  8|20  STOREHOST                  as BORNHOST, IPv6 when STOREHOSTADDRESS_V6_FLAG
      .     4  RECONSUMETIMES
      .     8  PREPAREDTRANSACTIONOFFSET
      .   4+n  BODY                       int32 length, bytes
      . 1|2+n  TOPIC                      UTF-8; V1: 1-byte length, V2: 2-byte length
      .   2+n  PROPERTIES                 int16 length, UTF-8 "name\\x01value\\x02..."

QUEUEOFFSET and PHYSICALOFFSET are known only once the record is placed, so
`patch_offsets` fills them in place; the body CRC does not cover them.

System entries (replicated metadata) share the log with messages: they start
with TOTALSIZE and a magic code of their own, so `peek_magic` tells them apart
and `decode` refuses any magic that is not a message magic.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from store import message_const as mc
from store.errors import MessageDecodeError, MessageEncodeError, PropertiesTooLargeError
from store.java_hash import tag_hash_code
from store.socket_address import UNSPECIFIED, SocketAddress

# 0xDAA320A7: topic length in 1 byte (RocketMQ writes V1 whenever the topic fits in 127 bytes).
MESSAGE_MAGIC_CODE: Final = -626843481
# 0xDAA320AB: topic length in 2 bytes.
MESSAGE_MAGIC_CODE_V2: Final = -626843477
# 0xCBD43194: filler at the end of a plain CommitLog file; never a message.
BLANK_MAGIC_CODE: Final = -875286124
MESSAGE_MAGIC_CODES: Final = frozenset((MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2))

TOTAL_SIZE_POSITION: Final = 0
MAGIC_CODE_POSITION: Final = 4
BODY_CRC_POSITION: Final = 8
QUEUE_ID_POSITION: Final = 12
FLAG_POSITION: Final = 16
QUEUE_OFFSET_POSITION: Final = 20
PHYSICAL_OFFSET_POSITION: Final = 28
SYSFLAG_POSITION: Final = 36
BORN_TIMESTAMP_POSITION: Final = 40
BORN_HOST_POSITION: Final = 48
# STORETIMESTAMP sits here only when the born host is IPv4 (RocketMQ's constant assumes it).
STORE_TIMESTAMP_POSITION: Final = 56

# Topics up to this many UTF-8 bytes use V1 (Java reads the V1 length as a signed byte).
MAX_V1_TOPIC_LENGTH: Final = 127
MAX_TOPIC_LENGTH: Final = 32767

_SIZE_AND_MAGIC = struct.Struct(">ii")
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent, patched together
# TOTALSIZE .. BORNTIMESTAMP: the part whose layout never changes.
_PREFIX = struct.Struct(">iiiiiqqiq")
_V6_BITS = mc.BORNHOST_V6_FLAG | mc.STOREHOSTADDRESS_V6_FLAG


def _middle(born_v6: bool, store_v6: bool) -> struct.Struct:
    """BORNHOST .. BODY length, for one combination of address families."""
    born = "16s" if born_v6 else "4s"
    store = "16s" if store_v6 else "4s"
    return struct.Struct(f">{born}iq{store}iiqi")


# Indexed by (sys_flag & _V6_BITS), so decoding picks its layout with one lookup.
_MIDDLE: dict[int, struct.Struct] = {
    bits: _middle(bool(bits & mc.BORNHOST_V6_FLAG), bool(bits & mc.STOREHOSTADDRESS_V6_FLAG))
    for bits in (0, mc.BORNHOST_V6_FLAG, mc.STOREHOSTADDRESS_V6_FLAG, _V6_BITS)
}
# The smallest possible record: IPv4 hosts, empty body, empty topic, no properties.
MIN_MESSAGE_SIZE: Final = _PREFIX.size + _MIDDLE[0].size + 1 + 2

_SHORT = struct.Struct(">h")
_USHORT = struct.Struct(">H")


@dataclass(slots=True)
class MessageExt:
    """A stored message, every field of the layout (RocketMQ's MessageExt).

    `encode` derives the two host-family bits of `sys_flag` from the addresses
    and computes the body CRC; `store_size` and `body_crc` are filled by
    `decode` and ignored by `encode` and by equality.
    """

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: SocketAddress = UNSPECIFIED
    store_timestamp: int = 0
    store_host: SocketAddress = UNSPECIFIED
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    store_size: int = field(default=0, compare=False)
    body_crc: int = field(default=0, compare=False)

    @property
    def tags(self) -> str | None:
        return self.properties.get(mc.TAGS)

    @property
    def keys(self) -> str | None:
        """The raw KEYS property, space separated (RocketMQ's Message.getKeys)."""
        return self.properties.get(mc.KEYS)

    @property
    def key_list(self) -> list[str]:
        """KEYS split on spaces, empty keys dropped (as the IndexService splits them)."""
        return [key for key in (self.keys or "").split(mc.KEY_SEPARATOR) if key]

    @property
    def uniq_key(self) -> str | None:
        """The client message id (UNIQ_KEY)."""
        return self.properties.get(mc.UNIQ_KEY)


@dataclass(slots=True)
class DispatchRequest:
    """What the apply loop needs from a message to update ConsumeQueues, the
    IndexFile and the broker's bookkeeping, read without copying the body or
    checking its CRC (RocketMQ's DispatchRequest). Produced by `peek`."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    born_timestamp: int
    sys_flag: int
    flag: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    body_offset: int
    body_length: int
    properties: dict[str, str]

    @property
    def keys(self) -> str | None:
        """The raw KEYS property (space separated), as the IndexService takes it."""
        return self.properties.get(mc.KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(mc.UNIQ_KEY)


# --- properties ----------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """name\\x01value\\x02 for each property, in mapping order.

    Raises MessageEncodeError for an empty name or a separator inside a name or
    value (the record could not be read back), PropertiesTooLargeError beyond
    32767 bytes. Values may be empty, although RocketMQ's own parser drops such
    properties when it reads them.
    """
    if not properties:
        return b""
    try:
        # str.join refuses a name or value that is not a str (a property is
        # text: decode gives back str, so an int would not read back as itself).
        text = "\x02".join(map("\x01".join, properties.items())) + "\x02"
    except TypeError:
        raise MessageEncodeError(_explain_bad_property(properties)) from None
    count = len(properties)
    if text.count("\x01") != count or text.count("\x02") != count or "" in properties:
        raise MessageEncodeError(_explain_bad_property(properties))
    data = text.encode("utf-8")
    if len(data) > mc.MAX_PROPERTIES_LENGTH:
        raise PropertiesTooLargeError(
            f"properties take {len(data)} bytes encoded, more than the limit of {mc.MAX_PROPERTIES_LENGTH}")
    return data


def _explain_bad_property(properties: Mapping[str, str]) -> str:
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            return f"property {name!r}={value!r}: names and values must be str"
        if not name:
            return "a property has an empty name"
        for text, what in ((name, "name"), (value, "value")):
            if "\x01" in text or "\x02" in text:
                return f"property {name!r}: the {what} contains a separator character (\\x01 or \\x02)"
    return "malformed properties"


def decode_properties(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """The inverse of `encode_properties`; a missing final separator is accepted."""
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise MessageDecodeError(f"properties are not valid UTF-8: {e}") from None
    if not text:
        return {}
    if text[-1] == "\x02":
        text = text[:-1]
    try:
        properties = dict([item.split("\x01", 1) for item in text.split("\x02")])
    except ValueError:
        raise MessageDecodeError(f"malformed properties: an item has no name/value separator in {text!r}") from None
    if "" in properties:
        raise MessageDecodeError(f"malformed properties: an empty property name in {text!r}")
    return properties


# --- encoding ------------------------------------------------------------------


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's BODYCRC: CRC-32 (zlib's polynomial, as java.util.zip.CRC32) with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode(message: MessageExt) -> bytes:
    """The stored record of `message` (V1 magic when the topic fits in 127 bytes)."""
    topic = message.topic.encode("utf-8")
    if not topic:
        raise MessageEncodeError("the topic is empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise MessageEncodeError(f"topic is {len(topic)} bytes, longer than {MAX_TOPIC_LENGTH}")
    properties = encode_properties(message.properties)
    body = message.body
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise MessageEncodeError(f"the body must be bytes, got {type(body).__name__}")
    born_host = message.born_host.packed()
    store_host = message.store_host.packed()
    sys_flag = message.sys_flag & ~_V6_BITS
    if message.born_host.is_ipv6:
        sys_flag |= mc.BORNHOST_V6_FLAG
    if message.store_host.is_ipv6:
        sys_flag |= mc.STOREHOSTADDRESS_V6_FLAG
    middle = _MIDDLE[sys_flag & _V6_BITS]
    if len(topic) <= MAX_V1_TOPIC_LENGTH:
        magic, topic_length = MESSAGE_MAGIC_CODE, bytes((len(topic),))
    else:
        magic, topic_length = MESSAGE_MAGIC_CODE_V2, _USHORT.pack(len(topic))
    total = (_PREFIX.size + middle.size + len(body) + len(topic_length) + len(topic)
             + 2 + len(properties))
    try:
        head = _PREFIX.pack(total, magic, body_crc(body), message.queue_id, message.flag,
                            message.queue_offset, message.physical_offset, sys_flag,
                            message.born_timestamp)
        head += middle.pack(born_host[:-4], message.born_host.port, message.store_timestamp,
                            store_host[:-4], message.store_host.port, message.reconsume_times,
                            message.prepared_transaction_offset, len(body))
    except struct.error:
        raise MessageEncodeError(_explain_out_of_range(message, total)) from None
    return b"".join((head, body, topic_length, topic, _SHORT.pack(len(properties)), properties))


_INT32_FIELDS = ("queue_id", "flag", "reconsume_times")
_INT64_FIELDS = ("queue_offset", "physical_offset", "born_timestamp", "store_timestamp",
                 "prepared_transaction_offset")


def _explain_out_of_range(message: MessageExt, total: int) -> str:
    if total > 0x7FFFFFFF:
        return f"the record would be {total} bytes, more than an int32 TOTALSIZE can hold"
    for name, bits in [(n, 32) for n in _INT32_FIELDS] + [(n, 64) for n in _INT64_FIELDS] + [("sys_flag", 32)]:
        value = getattr(message, name)
        if not isinstance(value, int) or not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            return f"{name}={value!r} does not fit in a signed {bits}-bit integer"
    return "a field is out of range"


def encode_batch(messages: Iterable[MessageExt]) -> bytes:
    """Records back to back, as they sit in a CommitLog or a batch buffer."""
    return b"".join([encode(message) for message in messages])


def patch_offsets(buf: bytearray | memoryview, queue_offset: int, physical_offset: int,
                  offset: int = 0) -> None:
    """Write QUEUEOFFSET and PHYSICALOFFSET of the record at `offset` in place.

    The commit log calls this once it knows where the entry lands (in DLedger
    mode the physical offset is the DLedger entry's pos + 48, its body start).
    Checks the magic code first, so it never scribbles over a system entry.
    """
    if not (0 <= queue_offset < 1 << 63 and 0 <= physical_offset < 1 << 63):
        raise MessageEncodeError(
            f"offsets must be non-negative int64 values, got queue offset {queue_offset}, "
            f"physical offset {physical_offset}")
    if len(buf) - offset < PHYSICAL_OFFSET_POSITION + 8:
        raise MessageDecodeError(f"cannot patch offsets: only {len(buf) - offset} bytes at offset {offset}")
    magic = peek_magic(buf, offset)
    if magic not in MESSAGE_MAGIC_CODES:
        raise MessageDecodeError(_bad_magic(magic, offset))
    _OFFSETS.pack_into(buf, offset + QUEUE_OFFSET_POSITION, queue_offset, physical_offset)


# --- decoding ------------------------------------------------------------------


def peek_magic(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """The magic code (the int32 after TOTALSIZE) of the record at `offset`, as a signed int."""
    if offset < 0 or len(buf) - offset < 8:
        raise MessageDecodeError(f"truncated record: fewer than 8 bytes at offset {offset}")
    magic: int = _SIZE_AND_MAGIC.unpack_from(buf, offset)[1]
    return magic


def peek_total_size(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """TOTALSIZE of the record at `offset`, whatever its magic."""
    if offset < 0 or len(buf) - offset < 4:
        raise MessageDecodeError(f"truncated record: fewer than 4 bytes at offset {offset}")
    total_size: int = _SIZE_AND_MAGIC.unpack_from(buf, offset)[0]
    return total_size


def _bad_magic(magic: int, offset: int) -> str:
    if magic == BLANK_MAGIC_CODE:
        return f"bad magic code at offset {offset}: a blank end-of-file record, not a message"
    return (f"bad magic code 0x{magic & 0xFFFFFFFF:08X} at offset {offset}: not a RocketMQ message "
            f"(expected 0x{MESSAGE_MAGIC_CODE & 0xFFFFFFFF:08X} or 0x{MESSAGE_MAGIC_CODE_V2 & 0xFFFFFFFF:08X})")


def _truncated(offset: int, what: str) -> MessageDecodeError:
    return MessageDecodeError(f"truncated message at offset {offset}: {what}")


# Fixed fields before the body, fixed fields after it, then the positions of
# body start, body length, topic start, topic length, properties start, record end.
_Layout = tuple[tuple[Any, ...], tuple[Any, ...], int, int, int, int, int, int]


def _parse(buf: bytes | bytearray | memoryview, offset: int) -> _Layout:
    """Check the framing of the record at `offset` and return its fixed fields
    and the positions of body, topic and properties. One struct call for each
    fixed part; no copies."""
    available = len(buf) - offset
    if offset < 0 or available < 8:
        raise _truncated(offset, f"only {max(available, 0)} bytes, not even a size and a magic code")
    total, magic = _SIZE_AND_MAGIC.unpack_from(buf, offset)
    if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
        raise MessageDecodeError(_bad_magic(magic, offset))
    if total < MIN_MESSAGE_SIZE:
        raise MessageDecodeError(
            f"bad total size {total} at offset {offset}: the smallest message is {MIN_MESSAGE_SIZE} bytes")
    if total > available:
        raise _truncated(offset, f"the record claims {total} bytes but only {available} are present")
    end = offset + total
    prefix = _PREFIX.unpack_from(buf, offset)
    middle_struct = _MIDDLE[prefix[7] & _V6_BITS]
    body_start = offset + _PREFIX.size + middle_struct.size
    if body_start > end:
        raise _truncated(offset, f"total size {total} ends inside the fixed fields")
    middle = middle_struct.unpack_from(buf, offset + _PREFIX.size)
    body_length = middle[7]
    topic_length_at = body_start + body_length
    if magic == MESSAGE_MAGIC_CODE:
        topic_start = topic_length_at + 1
        if body_length < 0 or topic_start > end:
            raise _truncated(offset, f"body length {body_length} runs past the total size {total}")
        topic_length = buf[topic_length_at]
    else:
        topic_start = topic_length_at + 2
        if body_length < 0 or topic_start > end:
            raise _truncated(offset, f"body length {body_length} runs past the total size {total}")
        topic_length = _USHORT.unpack_from(buf, topic_length_at)[0]
    properties_start = topic_start + topic_length + 2
    if properties_start > end:
        raise _truncated(offset, f"topic length {topic_length} runs past the total size {total}")
    properties_length = _SHORT.unpack_from(buf, properties_start - 2)[0]
    if properties_start + properties_length != end:
        raise MessageDecodeError(
            f"bad message at offset {offset}: properties length {properties_length} does not end the "
            f"record at its total size {total}")
    if topic_length == 0:
        raise MessageDecodeError(f"bad message at offset {offset}: empty topic")
    return prefix, middle, body_start, body_length, topic_start, topic_length, properties_start, end


def _topic(buf: bytes | bytearray | memoryview, start: int, length: int, offset: int) -> str:
    try:
        return str(buf[start:start + length], "utf-8")
    except UnicodeDecodeError:
        raise MessageDecodeError(f"bad message at offset {offset}: the topic is not valid UTF-8") from None


def decode(buf: bytes | bytearray | memoryview, offset: int = 0, *, crc_checked: bool = False) -> MessageExt:
    """The message whose record starts at `offset`, after checking the magic
    code, the total size against the fields and the buffer, and the body CRC
    (unless `crc_checked`: the caller verified a CRC over the whole record,
    as a DLedger entry's is, so the body's own would find nothing more).
    Raises MessageDecodeError saying which check failed."""
    prefix, middle, body_start, body_length, topic_start, topic_length, properties_start, end = _parse(buf, offset)
    body = bytes(buf[body_start:body_start + body_length])
    if not crc_checked and (crc := zlib.crc32(body) & 0x7FFFFFFF) != prefix[2]:
        raise MessageDecodeError(
            f"body CRC mismatch at offset {offset}: stored {prefix[2]}, computed {crc}")
    return MessageExt(
        topic=_topic(buf, topic_start, topic_length, offset),
        body=body,
        queue_id=prefix[3],
        flag=prefix[4],
        queue_offset=prefix[5],
        physical_offset=prefix[6],
        sys_flag=prefix[7],
        born_timestamp=prefix[8],
        born_host=SocketAddress.from_packed_ip(middle[0], middle[1]),
        store_timestamp=middle[2],
        store_host=SocketAddress.from_packed_ip(middle[3], middle[4]),
        reconsume_times=middle[5],
        prepared_transaction_offset=middle[6],
        properties=decode_properties(buf[properties_start:end]) if end > properties_start else {},
        store_size=prefix[0],
        body_crc=prefix[2],
    )


# What `decode` would return for a record just encoded, without decoding it:
# the fixed fields as unpacked from the record, topic, body and properties as
# they went in (encode writes them so that decode gives them back unchanged).
# Only tuples, ints, strs and bytes, the properties as (name, value) pairs:
# the garbage collector stops tracking such a tuple at its first collection
# (a dict inside, even an untracked one, would keep it tracked), so a cache
# of many of them adds nothing to a full collection's walk.
DecodedFields = tuple[tuple[Any, ...], tuple[Any, ...], str, bytes, tuple[tuple[str, str], ...]]


def decoded_fields(record: bytes | bytearray | memoryview, message: MessageExt) -> DecodedFields:
    """The fields `decode(record)` would give, for the record `encode(message)`
    returned (offsets patched in since); only the fixed parts are unpacked.
    (encode takes only str properties, which decode gives back unchanged.)"""
    properties = message.properties
    prefix = _PREFIX.unpack_from(record, 0)
    middle = _MIDDLE[prefix[7] & _V6_BITS].unpack_from(record, _PREFIX.size)
    body = message.body if type(message.body) is bytes else bytes(message.body)
    return prefix, middle, message.topic, body, tuple(properties.items())


def dispatch_request_of(fields: DecodedFields) -> DispatchRequest:
    """What `peek` gives for the record `fields` came from (`decoded_fields`),
    without parsing it: the leader's apply loop takes this for the entries
    it wrote itself (store/commit_log.py, `WrittenMessages`)."""
    prefix, middle, topic, body, pairs = fields
    return _dispatch_request(prefix, middle, topic, _PREFIX.size + _MIDDLE[prefix[7] & _V6_BITS].size, len(body),
                             dict(pairs))


def _dispatch_request(prefix: tuple[Any, ...], middle: tuple[Any, ...], topic: str, body_offset: int,
                      body_length: int, properties: dict[str, str]) -> DispatchRequest:
    # Positional, in the field order of DispatchRequest: every replica makes
    # one for every message it applies, and keywords cost twice as much here.
    return DispatchRequest(topic, prefix[3], prefix[5], prefix[6], prefix[0], tag_hash_code(properties.get(mc.TAGS)),
                           middle[2], prefix[8], prefix[7], prefix[4], middle[5], middle[6], prefix[2], body_offset,
                           body_length, properties)


def from_decoded_fields(fields: DecodedFields) -> MessageExt:
    """A new MessageExt equal to `decode` of the record `fields` came from
    (a properties dict of its own: callers may change what they get)."""
    prefix, middle, topic, body, properties = fields
    return MessageExt(topic, body, prefix[3], prefix[4], prefix[5], prefix[6], prefix[7], prefix[8],
                      SocketAddress.from_packed_ip(middle[0], middle[1]), middle[2],
                      SocketAddress.from_packed_ip(middle[3], middle[4]), middle[5], middle[6],
                      dict(properties), prefix[0], prefix[2])


def peek(buf: bytes | bytearray | memoryview, offset: int = 0) -> DispatchRequest:
    """The fields the apply loop dispatches on, without copying the body or
    checking its CRC (the replicated log has already checked the entry). The
    framing is checked as strictly as by `decode`."""
    prefix, middle, body_start, body_length, topic_start, topic_length, properties_start, end = _parse(buf, offset)
    properties = decode_properties(buf[properties_start:end]) if end > properties_start else {}
    return _dispatch_request(prefix, middle, _topic(buf, topic_start, topic_length, offset), body_start - offset,
                             body_length, properties)


def iter_messages(buf: bytes | bytearray | memoryview, offset: int = 0,
                  end: int | None = None) -> Iterator[MessageExt]:
    """Decode the records laid back to back in buf[offset:end]; raises on the
    first bad one (a batch is all good or it is refused)."""
    stop = len(buf) if end is None else end
    if stop > len(buf):
        raise _truncated(offset, f"end {stop} is past the buffer's {len(buf)} bytes")
    view = memoryview(buf)[:stop]
    while offset < stop:
        message = decode(view, offset)
        offset += message.store_size
        yield message
