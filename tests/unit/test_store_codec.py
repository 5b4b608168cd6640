"""The stored message layout, properties, message ids and Java hash codes."""
from __future__ import annotations

import random

import struct
import threading
import zlib

import pytest

from store import message_const as mc
from store.codec import (
    BLANK_MAGIC_CODE, BORN_HOST_POSITION, MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, PHYSICAL_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION, STORE_TIMESTAMP_POSITION, SYSFLAG_POSITION, MessageExt, body_crc, decode,
    decode_properties, encode, encode_batch, encode_properties, iter_messages, patch_offsets, peek, peek_magic,
    peek_total_size,
)
from store.errors import MessageDecodeError, MessageEncodeError, PropertiesTooLargeError
from store.java_hash import index_key_hash, index_key_hashes, java_string_hash, tag_hash_code
from store.message_id import (
    CLIENT_MESSAGE_ID_EPOCH, MessageIdGenerator, create_offset_message_id, decode_offset_message_id,
    parse_client_message_id,
)
from store.socket_address import SocketAddress

BORN = SocketAddress("192.168.0.7", 53211)
STORE = SocketAddress("10.0.0.1", 10911)


def sample(**overrides: object) -> MessageExt:
    fields: dict[str, object] = dict(
        topic="TopicTest", body=b"hello \x00 world" * 10, queue_id=3, flag=7, queue_offset=42,
        physical_offset=123_456, sys_flag=mc.TRANSACTION_PREPARED_TYPE, born_timestamp=1_700_000_000_123,
        born_host=BORN, store_timestamp=1_700_000_000_456, store_host=STORE, reconsume_times=2,
        prepared_transaction_offset=99,
        properties={mc.TAGS: "TagA", mc.KEYS: "order-1 order-2", mc.UNIQ_KEY: "01" + "AB" * 16,
                    "user.prop": "value with spaces and ünïcødé"},
    )
    fields.update(overrides)
    return MessageExt(**fields)  # type: ignore[arg-type]


def with_raw_properties(record: bytes, raw: bytes) -> bytes:
    """`record` (which has no properties) with its properties replaced by raw bytes."""
    assert record[-2:] == b"\x00\x00"
    rebuilt = bytearray(record[:-2] + struct.pack(">h", len(raw)) + raw)
    struct.pack_into(">i", rebuilt, 0, len(rebuilt))
    return bytes(rebuilt)


# --- layout --------------------------------------------------------------------


def test_round_trip_keeps_every_field_and_property():
    message = sample()
    record = encode(message)
    decoded = decode(record)
    assert decoded == message
    assert decoded.store_size == len(record)
    assert decoded.body_crc == body_crc(message.body)
    assert decoded.tags == "TagA"
    assert decoded.keys == "order-1 order-2" and decoded.key_list == ["order-1", "order-2"]
    assert decoded.uniq_key == "01" + "AB" * 16


def test_round_trip_with_ipv6_hosts_sets_the_host_flags():
    message = sample(born_host=SocketAddress("2001:db8::1", 40000), store_host=SocketAddress("::1", 10911))
    record = encode(message)
    decoded = decode(record)
    assert decoded.born_host == message.born_host and decoded.store_host == message.store_host
    assert decoded.sys_flag == message.sys_flag | mc.BORNHOST_V6_FLAG | mc.STOREHOSTADDRESS_V6_FLAG
    # Two 16-byte addresses instead of two 4-byte ones.
    assert len(record) == len(encode(sample())) + 24


def test_mixed_address_families_round_trip():
    message = sample(born_host=SocketAddress("fe80::2", 1), sys_flag=0)
    decoded = decode(encode(message))
    assert decoded.born_host.host == "fe80::2" and decoded.store_host == STORE
    assert decoded.sys_flag == mc.BORNHOST_V6_FLAG


def test_fields_sit_at_rocketmq_positions():
    record = encode(sample())
    assert record[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", record, 0)[0] == len(record)
    assert struct.unpack_from(">i", record, 8)[0] == zlib.crc32(sample().body) & 0x7FFFFFFF
    assert struct.unpack_from(">iiqq", record, 12) == (3, 7, 42, 123_456)
    assert struct.unpack_from(">q", record, QUEUE_OFFSET_POSITION)[0] == 42
    assert struct.unpack_from(">q", record, PHYSICAL_OFFSET_POSITION)[0] == 123_456
    assert struct.unpack_from(">i", record, SYSFLAG_POSITION)[0] == mc.TRANSACTION_PREPARED_TYPE
    assert record[BORN_HOST_POSITION:BORN_HOST_POSITION + 8] == bytes([192, 168, 0, 7]) + struct.pack(">i", 53211)
    assert struct.unpack_from(">q", record, STORE_TIMESTAMP_POSITION)[0] == 1_700_000_000_456
    # IPv4 hosts: the body length is at 84 and the body at 88.
    assert struct.unpack_from(">i", record, 84)[0] == len(sample().body)
    assert record[88:88 + len(sample().body)] == sample().body


def test_body_crc_is_crc32_with_the_sign_bit_cleared():
    assert body_crc(b"123456789") == 0xCBF43926 & 0x7FFFFFFF
    assert body_crc(b"") == 0


def test_long_topic_uses_v2_magic_with_a_two_byte_length():
    topic = "T" * 200
    record = encode(sample(topic=topic))
    assert peek_magic(record) == MESSAGE_MAGIC_CODE_V2
    assert decode(record).topic == topic
    assert peek_magic(encode(sample(topic="T" * 127))) == MESSAGE_MAGIC_CODE


def test_decode_accepts_v2_for_a_short_topic():
    record = encode(sample(properties={}))
    topic_at = len(record) - 2 - len("TopicTest") - 1
    v2 = bytearray(record[:topic_at] + struct.pack(">H", 9) + record[topic_at + 1:])
    struct.pack_into(">ii", v2, 0, len(v2), MESSAGE_MAGIC_CODE_V2)
    assert decode(bytes(v2)).topic == "TopicTest"


def test_decode_at_an_offset_inside_a_larger_buffer():
    record = encode(sample())
    buffer = bytearray(b"\xff" * 13 + record + b"\xee" * 5)
    assert decode(buffer, 13) == sample()
    assert decode(memoryview(buffer), 13) == sample()


# --- rejections ----------------------------------------------------------------


def test_bad_magic_is_rejected():
    record = bytearray(encode(sample()))
    struct.pack_into(">i", record, 4, 0x12345678)
    with pytest.raises(MessageDecodeError, match="bad magic code 0x12345678 at offset 0"):
        decode(record)


def test_blank_and_system_magics_are_not_messages():
    record = bytearray(encode(sample()))
    struct.pack_into(">i", record, 4, BLANK_MAGIC_CODE)
    with pytest.raises(MessageDecodeError, match="blank end-of-file record"):
        decode(record)
    system_entry = struct.pack(">ii", 16, -0x1234567) + b"12345678"
    assert peek_magic(system_entry) == -0x1234567
    assert peek_total_size(system_entry) == 16
    with pytest.raises(MessageDecodeError, match="bad magic code"):
        peek(system_entry)


@pytest.mark.parametrize("keep", [0, 5, 60, 100, -1])
def test_truncated_buffer_is_rejected(keep: int):
    record = encode(sample())
    with pytest.raises(MessageDecodeError, match="truncated"):
        decode(record[:keep] if keep >= 0 else record[:-1])


def test_total_size_that_disagrees_with_the_fields_is_rejected():
    record = bytearray(encode(sample()) + b"\x00\x00")
    struct.pack_into(">i", record, 0, len(record))
    with pytest.raises(MessageDecodeError, match="does not end the record"):
        decode(record)
    struct.pack_into(">i", record, 0, 50)
    with pytest.raises(MessageDecodeError, match="bad total size 50"):
        decode(record)


def test_flipped_body_byte_fails_the_crc():
    record = bytearray(encode(sample()))
    record[90] ^= 0x01
    with pytest.raises(MessageDecodeError, match="body CRC mismatch"):
        decode(record)


def test_a_record_whose_crc_the_caller_checked_skips_only_the_body_crc():
    # What a read from the log does: the entry's CRC covered the record.
    assert decode(encode(sample()), crc_checked=True) == decode(encode(sample()))
    record = bytearray(encode(sample()))
    record[90] ^= 0x01   # the body starts at 88: taken as it is, not refused
    assert decode(record, crc_checked=True).body[2] == sample().body[2] ^ 0x01
    record[4] ^= 0xFF   # the framing is still checked
    with pytest.raises(MessageDecodeError):
        decode(record, crc_checked=True)


def test_negative_body_length_is_rejected():
    record = bytearray(encode(sample()))
    struct.pack_into(">i", record, 84, -5)
    with pytest.raises(MessageDecodeError, match="body length -5"):
        decode(record)


@pytest.mark.parametrize("raw, reason", [
    (b"novalue\x02", "no name/value separator"),
    (b"\x01value\x02", "empty property name"),
    (b"\xff\xfe\x01v\x02", "not valid UTF-8"),
])
def test_malformed_properties_are_rejected(raw: bytes, reason: str):
    record = with_raw_properties(encode(sample(properties={})), raw)
    with pytest.raises(MessageDecodeError, match=reason):
        decode(record)


def test_properties_without_a_final_separator_are_read():
    record = with_raw_properties(encode(sample(properties={})), b"a\x01b\x02c\x01d")
    assert decode(record).properties == {"a": "b", "c": "d"}


# --- properties ----------------------------------------------------------------


def test_properties_use_rocketmq_separators_in_order():
    assert encode_properties({"TAGS": "A", "KEYS": "k1 k2", "empty": ""}) == b"TAGS\x01A\x02KEYS\x01k1 k2\x02empty\x01\x02"
    assert decode_properties(b"TAGS\x01A\x02KEYS\x01k1 k2\x02") == {"TAGS": "A", "KEYS": "k1 k2"}
    assert encode_properties({}) == b""


@pytest.mark.parametrize("properties, reason", [
    ({"a\x01b": "v"}, "name contains a separator"),
    ({"a": "v\x02w"}, "value contains a separator"),
    ({"": "v"}, "empty name"),
])
def test_properties_that_could_not_be_read_back_are_refused(properties: dict[str, str], reason: str):
    with pytest.raises(MessageEncodeError, match=reason):
        encode(sample(properties=properties))


def test_properties_over_32767_bytes_are_refused():
    assert len(encode_properties({"k": "v" * (32767 - 3)})) == 32767  # "k", 2 separators: at the limit
    with pytest.raises(PropertiesTooLargeError, match="32768 bytes"):
        encode_properties({"k": "v" * (32767 - 2)})


# --- encoding errors -----------------------------------------------------------


def test_out_of_range_field_names_the_field():
    with pytest.raises(MessageEncodeError, match="queue_id=2147483648 does not fit"):
        encode(sample(queue_id=1 << 31))
    with pytest.raises(MessageEncodeError, match="store_timestamp"):
        encode(sample(store_timestamp=-(1 << 63) - 1))


def test_empty_topic_and_bad_host_are_refused():
    with pytest.raises(MessageEncodeError, match="topic is empty"):
        encode(sample(topic=""))
    with pytest.raises(MessageEncodeError, match="not an IPv4 or IPv6 address"):
        encode(sample(store_host=SocketAddress("broker-a", 10911)))
    with pytest.raises(MessageEncodeError, match="port 70000"):
        encode(sample(born_host=SocketAddress("1.2.3.4", 70000)))


# --- patching, peeking, batches ------------------------------------------------


def test_patch_offsets_fills_queue_and_physical_offset_in_place():
    record = bytearray(encode(sample(queue_offset=0, physical_offset=0)))
    patch_offsets(record, 77, 4096 + 48)
    decoded = decode(record)  # the body CRC does not cover the offsets
    assert (decoded.queue_offset, decoded.physical_offset) == (77, 4096 + 48)


def test_patch_offsets_refuses_a_non_message_and_leaves_it_unchanged():
    system_entry = bytearray(struct.pack(">ii", 40, 0x0BADC0DE) + bytes(32))
    before = bytes(system_entry)
    with pytest.raises(MessageDecodeError, match="bad magic"):
        patch_offsets(system_entry, 1, 2)
    assert system_entry == before
    with pytest.raises(MessageEncodeError, match="non-negative"):
        patch_offsets(bytearray(encode(sample())), -1, 2)


def test_peek_reads_dispatch_fields_without_checking_the_body():
    message = sample()
    record = bytearray(encode(message))
    request = peek(record)
    assert (request.topic, request.queue_id, request.queue_offset, request.physical_offset) == ("TopicTest", 3, 42, 123_456)
    assert request.msg_size == len(record)
    assert request.tags_code == tag_hash_code("TagA")
    assert request.store_timestamp == message.store_timestamp
    assert request.keys == "order-1 order-2" and request.uniq_key == message.uniq_key
    assert bytes(record[request.body_offset:request.body_offset + request.body_length]) == message.body
    record[request.body_offset] ^= 0xFF  # peek trusts the log's own CRC; decode would refuse this
    assert peek(record).topic == "TopicTest"


def test_batch_encodes_back_to_back_and_iterates_in_order():
    messages = [sample(queue_offset=i, body=bytes([i]) * (i * 50)) for i in range(5)]
    buffer = encode_batch(messages)
    assert list(iter_messages(buffer)) == messages
    with pytest.raises(MessageDecodeError, match="truncated"):
        list(iter_messages(buffer[:-1]))


# --- message ids ---------------------------------------------------------------


def test_offset_message_id_is_host_port_and_offset_in_uppercase_hex():
    message_id = create_offset_message_id(SocketAddress("10.0.0.1", 10911), 0x1234)
    assert message_id == "0A00000100002A9F0000000000001234"
    assert decode_offset_message_id(message_id) == (SocketAddress("10.0.0.1", 10911), 0x1234)


def test_offset_message_id_of_an_ipv6_store_host_round_trips():
    message_id = create_offset_message_id(SocketAddress("2001:db8::5", 8081), 1 << 40)
    assert len(message_id) == 56 and message_id == message_id.upper()
    assert decode_offset_message_id(message_id) == (SocketAddress("2001:db8::5", 8081), 1 << 40)
    with pytest.raises(ValueError, match="32 .IPv4. or 56"):
        decode_offset_message_id("ABC")


def test_client_message_id_has_the_v1_layout():
    clock_at = CLIENT_MESSAGE_ID_EPOCH + 86_400 + 0.5
    generator = MessageIdGenerator(mac=bytes.fromhex("56F7E71C361B"), pid=0x1_21BC, clock=lambda: clock_at)
    first, second = generator.next_id(), generator.next_id()
    assert first == "0156F7E71C361B21BC" + "00015180" + "00000000"
    assert len(second) == 34 and second == second.upper()
    parsed = parse_client_message_id(second)
    assert (parsed.mac.hex().upper(), parsed.pid, parsed.seconds_since_2021, parsed.sequence) == \
        ("56F7E71C361B", 0x21BC, 86_400, 1)
    assert str(parsed) == second
    with pytest.raises(ValueError, match="not a version 01"):
        parse_client_message_id("00" + "0" * 32)


def test_client_message_ids_are_unique_across_threads():
    generator = MessageIdGenerator()
    ids: list[str] = []

    def make() -> None:
        batch = [generator.next_id() for _ in range(2000)]
        ids.extend(batch)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 8000


# --- Java hash codes -----------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("hello", 99162322),
    ("Hello World", -862545276),
    ("TagA", 2598919),
    ("Aa", 2112),
    ("BB", 2112),
    ("polygenelubricants", -(1 << 31)),
    ("é", 233),
    ("\U0001F600", 31 * 0xD83D + 0xDE00),  # one code point, two UTF-16 code units
])
def test_java_string_hash_matches_java(text: str, expected: int):
    assert java_string_hash(text) == expected


def test_tag_hash_code_is_the_java_int_widened_and_zero_for_no_tag():
    assert tag_hash_code("Hello World") == -862545276
    assert tag_hash_code(None) == 0 and tag_hash_code("") == 0


def test_index_key_hash_is_the_absolute_value_and_zero_for_min_int():
    assert index_key_hash("Hello World") == 862545276
    assert index_key_hash("hello") == 99162322
    assert index_key_hash("polygenelubricants") == 0


@pytest.mark.parametrize("count", [1, 7, 8, 64, 1000])
def test_index_key_hashes_of_a_run_equal_each_keys_own(count: int):
    """The vectorised run (index_key_hashes) against the per-key hash: the
    known values, every length up to long keys, an empty key, and a run with
    one non-ASCII key (the exact UTF-16 path)."""
    rng = random.Random(count)
    keys = ["Hello World", "hello", "polygenelubricants", "", "x" * 3000] + [
        "".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(1, 90))) for _ in range(count)]
    assert index_key_hashes(keys)[:3] == [862545276, 99162322, 0]
    assert index_key_hashes(keys) == [index_key_hash(k) for k in keys]
    mixed = keys + ["Topic#\U0001F600é"]
    assert index_key_hashes(mixed) == [index_key_hash(k) for k in mixed]
