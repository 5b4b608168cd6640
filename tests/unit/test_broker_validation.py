"""Each request check accepts what RocketMQ 5 accepts and refuses the rest with its code."""
from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from broker import validation as v
from broker.errors import BrokerError
from broker.filter_expression import MATCH_ALL, parse_filter_expression
from store.java_hash import java_string_hash
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb


def refused(code: int, check, *args, **kwargs) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        check(*args, **kwargs)
    assert pb.Code.Name(caught.value.code) == pb.Code.Name(code)
    assert caught.value.message  # a person must learn what to change
    return caught.value


# ------------------------------------------------------------------ errors


def test_broker_error_carries_code_and_readable_message_into_a_status():
    error = BrokerError(pb.ILLEGAL_TOPIC, "the topic is blank")
    assert str(error) == "ILLEGAL_TOPIC: the topic is blank"
    assert error.to_status() == pb.Status(code=pb.ILLEGAL_TOPIC, message="the topic is blank")


@pytest.mark.parametrize("code", [pb.OK, pb.MULTIPLE_RESULTS, pb.CODE_UNSPECIFIED, 12345])
def test_broker_error_refuses_success_and_unknown_codes(code):
    with pytest.raises(ValueError):
        BrokerError(code, "x")


# ------------------------------------------------------------------ topics


@pytest.mark.parametrize("topic", ["orders", "a", "Order_2024-x", "%ns%orders", "a|b", "t" * 127])
def test_topic_accepts_rocketmq_charset_up_to_127_chars(topic):
    v.validate_topic(topic)
    v.validate_send_topic(topic)


@pytest.mark.parametrize("topic", ["", "   ", "t" * 128, "has space", "dot.ted", "naïve", "a/b"])
def test_topic_refuses_blank_long_and_illegal_characters(topic):
    refused(pb.ILLEGAL_TOPIC, v.validate_topic, topic)


@pytest.mark.parametrize("topic", ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_REVIVE_LOG_c1"])
def test_topic_refuses_system_topics(topic):
    refused(pb.ILLEGAL_TOPIC, v.validate_topic, topic)


@pytest.mark.parametrize("topic", ["%RETRY%group", "%DLQ%group"])
def test_retry_and_dead_letter_topics_can_be_read_but_not_sent_to(topic):
    v.validate_topic(topic)
    refused(pb.ILLEGAL_TOPIC, v.validate_send_topic, topic)


# ---------------------------------------------------------- consumer groups


@pytest.mark.parametrize("group", ["billing", "GID_billing-1", "g" * 255])
def test_consumer_group_accepts_rocketmq_charset_up_to_255_chars(group):
    v.validate_consumer_group(group)


@pytest.mark.parametrize("group", ["", " ", "g" * 256, "bad group", "bad.group"])
def test_consumer_group_refuses_blank_long_and_illegal_characters(group):
    refused(pb.ILLEGAL_CONSUMER_GROUP, v.validate_consumer_group, group)


@pytest.mark.parametrize("group", ["CID_RMQ_SYS_ANYTHING", "TOOLS_CONSUMER", "DEFAULT_CONSUMER"])
def test_consumer_group_refuses_system_groups(group):
    refused(pb.ILLEGAL_CONSUMER_GROUP, v.validate_consumer_group, group)


# --------------------------------------------------------- tags and keys


@pytest.mark.parametrize("tag", ["", "TagA", "tag with spaces", "t" * 128])
def test_tag_accepts_untagged_and_ordinary_tags(tag):
    v.validate_tag(tag)


@pytest.mark.parametrize("tag", ["   ", "A||B", "A|B", "bad\x01tag", "t" * 129])
def test_tag_refuses_blank_pipes_control_characters_and_overlong(tag):
    refused(pb.ILLEGAL_MESSAGE_TAG, v.validate_tag, tag)


def test_keys_accept_ordinary_and_ignore_empty_keys():
    v.validate_keys(["order-1", "", "customer 7"])


@pytest.mark.parametrize("key", [" ", "bad\nkey"])
def test_keys_refuse_blank_and_control_characters(key):
    refused(pb.ILLEGAL_MESSAGE_KEY, v.validate_keys, ["fine", key])


# ---------------------------------------------------------- message group


@pytest.mark.parametrize("group", ["", "customer-42", "g" * 63])
def test_message_group_accepts_none_and_up_to_63_bytes(group):
    v.validate_message_group(group)


@pytest.mark.parametrize("group", [" ", "g" * 64, "é" * 32, "bad\tgroup"])
def test_message_group_refuses_blank_64_bytes_or_more_and_control_characters(group):
    refused(pb.ILLEGAL_MESSAGE_GROUP, v.validate_message_group, group)


# ------------------------------------------------------------ message id


@pytest.mark.parametrize("message_id", ["0156F7E71C361B21BC024CCDBE00000000", "0156f7e71c361b21bc024ccdbe00000000",
                                        "7F0000010D7418B4AAC2143A1FE40000"])
def test_message_id_accepts_v1_ids_and_4x_unique_keys(message_id):
    v.validate_message_id(message_id)


@pytest.mark.parametrize("message_id", ["", "  ", "0256F7E71C361B21BC024CCDBE00000000", "01XYZ", "not-an-id",
                                        "0156F7E71C361B21BC024CCDBE0000000000"])
def test_message_id_refuses_empty_and_malformed_ids(message_id):
    refused(pb.ILLEGAL_MESSAGE_ID, v.validate_message_id, message_id)


# ------------------------------------------------------------ properties


def test_user_properties_accept_application_properties():
    v.validate_user_properties({"orderId": "42", "region": "eu-west"}, tag="TagA", keys=["k1"])


@pytest.mark.parametrize("name", ["KEYS", "TAGS", "UNIQ_KEY", "DELAY", "TIMER_DELIVER_MS", "__BORNHOST"])
def test_user_properties_refuse_names_the_broker_reserves(name):
    refused(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, v.validate_user_properties, {name: "x"})


@pytest.mark.parametrize("props", [{"": "x"}, {" ": "x"}, {"a\x01b": "x"}, {"ok": "bad\x02value"}])
def test_user_properties_refuse_empty_names_and_control_characters(props):
    refused(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, v.validate_user_properties, props)


def test_user_properties_refuse_more_than_128_entries():
    v.validate_user_properties({f"k{i}": "v" for i in range(128)})
    refused(pb.MESSAGE_PROPERTIES_TOO_LARGE, v.validate_user_properties, {f"k{i}": "v" for i in range(129)})


def test_user_properties_size_counts_tag_and_keys_against_16_kib():
    almost = {"k": "v" * (16 * 1024 - 1 - 4)}
    v.validate_user_properties(almost, tag="TagA")
    refused(pb.MESSAGE_PROPERTIES_TOO_LARGE, v.validate_user_properties, almost, tag="TagA", keys=["x"])


def test_stored_properties_over_the_stores_32767_byte_field_are_too_large():
    # One property "k" + 0x01 + value + 0x02: 3 bytes of overhead.
    v.validate_properties_size({"k": "v" * (32767 - 3)})
    refused(pb.MESSAGE_PROPERTIES_TOO_LARGE, v.validate_properties_size, {"k": "v" * (32767 - 2)})


# ----------------------------------------------------------------- body


def test_body_accepts_one_byte_up_to_the_configured_max():
    v.validate_body(b"x")
    v.validate_body(b"x" * (4 * 1024 * 1024))
    v.validate_body(b"x" * 10, v.ValidationLimits(max_body_bytes=10))


def test_body_refuses_empty_with_its_own_code():
    refused(pb.MESSAGE_BODY_EMPTY, v.validate_body, b"")


def test_body_refuses_more_than_4_mib_by_default_and_more_than_a_configured_max():
    refused(pb.MESSAGE_BODY_TOO_LARGE, v.validate_body, b"x" * (4 * 1024 * 1024 + 1))
    refused(pb.MESSAGE_BODY_TOO_LARGE, v.validate_body, b"x" * 11, v.ValidationLimits(max_body_bytes=10))


# -------------------------------------------------------- delivery time

NOW_MS = 1_800_000_000_000
DAY_MS = 24 * 3600 * 1000


@pytest.mark.parametrize("delivery_ms", [NOW_MS - 60_000, NOW_MS, NOW_MS + 10_000, NOW_MS + DAY_MS])
def test_delivery_time_in_the_past_or_within_24_hours_is_accepted(delivery_ms):
    v.validate_delivery_timestamp(delivery_ms, NOW_MS)


def test_delivery_time_beyond_the_max_delay_is_illegal():
    refused(pb.ILLEGAL_DELIVERY_TIME, v.validate_delivery_timestamp, NOW_MS + DAY_MS + 1, NOW_MS)
    refused(pb.ILLEGAL_DELIVERY_TIME, v.validate_delivery_timestamp, NOW_MS + 61_000, NOW_MS,
            v.ValidationLimits(max_delay=timedelta(minutes=1)))


# ---------------------------------------------------------- message type


def props(message_type: int, **fields) -> pb.SystemProperties:
    return pb.SystemProperties(message_type=message_type, **fields)


DUE = Timestamp(seconds=1_800_000_000)


@pytest.mark.parametrize("properties", [
    props(pb.NORMAL),
    props(pb.FIFO, message_group="g1"),
    props(pb.DELAY, delivery_timestamp=DUE),
    props(pb.TRANSACTION),
    props(pb.LITE, lite_topic="lt"),
    props(pb.PRIORITY, priority=0),
    props(pb.MESSAGE_TYPE_UNSPECIFIED),
    props(pb.MESSAGE_TYPE_UNSPECIFIED, message_group="g1"),
])
def test_message_type_accepts_the_properties_it_calls_for(properties):
    v.validate_message_type(properties)


@pytest.mark.parametrize("properties", [
    props(pb.NORMAL, message_group="g1"),
    props(pb.NORMAL, delivery_timestamp=DUE),
    props(pb.FIFO),
    props(pb.FIFO, message_group="g1", delivery_timestamp=DUE),
    props(pb.DELAY),
    props(pb.DELAY, delivery_timestamp=DUE, message_group="g1"),
    props(pb.TRANSACTION, message_group="g1"),
    props(pb.TRANSACTION, delivery_timestamp=DUE),
    props(pb.LITE),
    props(pb.PRIORITY, priority=1, lite_topic="lt"),
    props(pb.MESSAGE_TYPE_UNSPECIFIED, message_group="g1", delivery_timestamp=DUE),
])
def test_message_type_conflicting_with_its_properties_is_refused(properties):
    refused(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, v.validate_message_type, properties)


# ----------------------------------------------------- invisible duration


@pytest.mark.parametrize("seconds", [10, 60, 12 * 3600])
def test_receive_invisible_duration_accepts_10_seconds_to_12_hours(seconds):
    v.validate_invisible_duration(timedelta(seconds=seconds), for_receive=True)


@pytest.mark.parametrize("seconds", [0, 9.999, 12 * 3600 + 1, -1])
def test_receive_invisible_duration_outside_10_seconds_to_12_hours_is_illegal(seconds):
    refused(pb.ILLEGAL_INVISIBLE_TIME, v.validate_invisible_duration, timedelta(seconds=seconds), for_receive=True)


def test_change_invisible_duration_may_go_down_to_zero_but_not_below_or_past_12_hours():
    v.validate_invisible_duration(timedelta(0), for_receive=False)
    refused(pb.ILLEGAL_INVISIBLE_TIME, v.validate_invisible_duration, timedelta(seconds=-1), for_receive=False)
    refused(pb.ILLEGAL_INVISIBLE_TIME, v.validate_invisible_duration, timedelta(hours=12, seconds=1),
            for_receive=False)


# --------------------------------------------------------- long polling

S = timedelta(seconds=1)
REQUEST_TIMEOUT = 3 * S


@pytest.mark.parametrize("requested, remaining, expected", [
    (20 * S, 23 * S, 20 * S),   # the Python client's defaults: 20 s wait in a 23 s call
    (1 * S, 23 * S, 5 * S),     # below the range: raised to the minimum, not refused
    (60 * S, 90 * S, 20 * S),   # above the range: lowered to the maximum
    (20 * S, 8 * S, 8 * S),     # the call's deadline cuts it short
    (None, 23 * S, 20 * S),     # unspecified: remaining deadline less half the request timeout, clamped
    (None, 10 * S, 8.5 * S),
    (15 * S, None, 15 * S),     # no deadline on the call
])
def test_long_polling_time_is_clamped_to_5_to_20_seconds_and_the_deadline(requested, remaining, expected):
    assert v.effective_long_polling_timeout(requested, remaining, REQUEST_TIMEOUT) == expected


def test_long_polling_is_illegal_when_the_deadline_leaves_less_than_the_minimum():
    refused(pb.ILLEGAL_POLLING_TIME, v.effective_long_polling_timeout, 20 * S, 4 * S, REQUEST_TIMEOUT)
    refused(pb.ILLEGAL_POLLING_TIME, v.check_polling_deadline, 4 * S)
    v.check_polling_deadline(5 * S)
    v.check_polling_deadline(None)


def test_a_receive_held_through_a_leader_change_polls_what_is_left_rather_than_failing():
    # Its deadline was judged where it arrived; the election used up the rest.
    assert v.effective_long_polling_timeout(5 * S, 4 * S, REQUEST_TIMEOUT, held=True) == 4 * S
    assert v.effective_long_polling_timeout(5 * S, -1 * S, REQUEST_TIMEOUT, held=True) == 0 * S


# ------------------------------------------------------ filter expressions


def test_java_string_hash_matches_javas_string_hashcode():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31  # wraps like a Java int
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair


@pytest.mark.parametrize("length", [1, 31, 511, 512, 513, 2000])
def test_java_string_hash_agrees_with_hashcodes_own_loop_at_every_length(length):
    def horner(text: str) -> int:  # String.hashCode as Java writes it
        encoded = text.encode("utf-16-be", "surrogatepass")
        h = 0
        for i in range(0, len(encoded), 2):
            h = (31 * h + int.from_bytes(encoded[i:i + 2], "big")) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    ascii_text = "".join(chr(32 + (i * 7) % 95) for i in range(length))
    mixed = "".join(chr(0x4E00 + (i * 13) % 5000) if i % 3 else "k" for i in range(length))
    assert java_string_hash(ascii_text) == horner(ascii_text)
    assert java_string_hash(mixed) == horner(mixed)


@pytest.mark.parametrize("expression", ["*", "", "  *  "])
def test_star_or_empty_expression_matches_every_message_tagged_or_not(expression):
    tag_filter = parse_filter_expression(pb.TAG, expression)
    assert tag_filter == MATCH_ALL and tag_filter.matches_all
    assert tag_filter.matches("TagA") and tag_filter.matches(None) and tag_filter.matches("")
    assert tag_filter.tag_hashes == frozenset()


def test_single_tag_matches_only_that_tag():
    tag_filter = parse_filter_expression(pb.TAG, "TagA")
    assert tag_filter.matches("TagA")
    assert not tag_filter.matches("TagB") and not tag_filter.matches(None) and not tag_filter.matches("taga")
    assert tag_filter.tag_hashes == frozenset({java_string_hash("TagA")})


@pytest.mark.parametrize("expression", ["TagA || TagB", "TagA||TagB", "  TagA ||   TagB  ", "TagB || TagA || TagA"])
def test_alternatives_match_any_listed_tag_whitespace_tolerant(expression):
    tag_filter = parse_filter_expression(pb.TAG, expression)
    assert tag_filter.tags == frozenset({"TagA", "TagB"})
    assert tag_filter.tag_hashes == frozenset({java_string_hash("TagA"), java_string_hash("TagB")})
    assert tag_filter.matches("TagB") and not tag_filter.matches("TagC")


def test_unspecified_filter_type_is_read_as_a_tag_expression():
    assert parse_filter_expression(pb.FILTER_TYPE_UNSPECIFIED, "TagA").tags == frozenset({"TagA"})


@pytest.mark.parametrize("expression", ["TagA ||", "|| TagA", "TagA || || TagB", "TagA | TagB", "TagA|||TagB",
                                        "* || TagA", "Tag\x01A"])
def test_malformed_tag_expressions_are_illegal_and_say_what_is_supported(expression):
    error = refused(pb.ILLEGAL_FILTER_EXPRESSION, parse_filter_expression, pb.TAG, expression)
    assert "TagA || TagB" in error.message


def test_sql92_filters_are_refused_with_what_is_supported():
    error = refused(pb.ILLEGAL_FILTER_EXPRESSION, parse_filter_expression, pb.SQL, "a > 5 AND TAGS = 'x'")
    assert "SQL92" in error.message and "'*'" in error.message
