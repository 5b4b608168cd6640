"""broker.client.message: a delivered protocol message as the application
sees it (the consumer's side of to_delivered), without sockets."""
from __future__ import annotations

import zlib
from datetime import datetime, timedelta, timezone

from broker.client.message import from_protocol
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

UTC = timezone.utc


def delivered(**system: object) -> pb.Message:
    message = pb.Message(body=b"payload")
    message.topic.name = "Orders"
    fields = message.system_properties
    fields.message_id = "01" + "ab" * 16
    fields.receipt_handle = "1:0:5:9:ff:0"
    fields.born_timestamp.seconds, fields.born_timestamp.nanos = 1_700_000_000, 123_000_000
    fields.body_digest.type = pb.CRC32
    fields.body_digest.checksum = f"{zlib.crc32(b'payload'):08X}"
    for name, value in system.items():
        setattr(fields, name, value)
    return message


def test_times_are_the_brokers_to_the_millisecond_and_absent_ones_stay_none():
    message = delivered()
    system = message.system_properties
    system.store_timestamp.seconds, system.store_timestamp.nanos = 1_700_000_001, 456_000_000
    received = from_protocol(message)
    assert received.born_timestamp == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    assert received.store_timestamp == datetime(2023, 11, 14, 22, 13, 21, 456_000, tzinfo=UTC)
    assert received.born_epoch_s == 1_700_000_000.123
    assert received.delivery_timestamp is None and received.invisible_duration is None
    assert not received.corrupted


def test_a_delayed_message_carries_its_delivery_time_and_the_lease_its_duration():
    message = delivered()
    system = message.system_properties
    system.delivery_timestamp.seconds = 1_700_000_060
    system.invisible_duration.seconds, system.invisible_duration.nanos = 30, 500_000_000
    received = from_protocol(message)
    assert received.delivery_timestamp == datetime(2023, 11, 14, 22, 14, 20, tzinfo=UTC)
    assert received.invisible_duration == timedelta(seconds=30.5)
    # The same duration on the next message is the same (immutable) value.
    assert from_protocol(message).invisible_duration is received.invisible_duration


def test_a_body_that_does_not_match_its_digest_is_delivered_marked_corrupted():
    message = delivered()
    message.body = b"tampered"
    received = from_protocol(message)
    assert received.corrupted and received.body == b"tampered"
