"""Tag filter expressions: what a consumer subscribes to within a topic.

RocketMQ's tag syntax: `*` (every message, tagged or not), one tag `TagA`, or
alternatives `TagA || TagB`, whitespace around tags ignored. ConsumeQueue units
carry the tag's Java `String.hashCode()`, so the broker skips non-matching
messages by hash and then compares the tag itself (hashes collide).

SQL92 filters (FilterType.SQL) are refused: RocketMQ ships them disabled
(`enablePropertyFilter=false`) and we do not implement them.
"""
from __future__ import annotations

from dataclasses import dataclass

from broker.errors import BrokerError
from broker.validation import contains_control_character
from store.java_hash import tag_hash_code
from rpcgen.apache.rocketmq.v2 import definition_pb2
from rpcgen.apache.rocketmq.v2.definition_pb2 import FilterType

SUBSCRIBE_ALL = "*"
ALTERNATIVE_SEPARATOR = "||"
SUPPORTED = "supported: '*', 'TagA' or 'TagA || TagB'"


@dataclass(frozen=True)
class TagFilter:
    """A parsed tag expression. No tags means `*`: every message matches."""

    tags: frozenset[str]
    tag_hashes: frozenset[int]

    @classmethod
    def of(cls, tags: frozenset[str]) -> TagFilter:
        return cls(tags, frozenset(tag_hash_code(t) for t in tags))

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def matches(self, tag: str | None) -> bool:
        """Whether a message with this tag (None or "" = untagged) is delivered."""
        return self.matches_all or (tag or "") in self.tags


MATCH_ALL = TagFilter.of(frozenset())


def parse_filter_expression(filter_type: FilterType, expression: str) -> TagFilter:
    """Parse a subscription's filter, refusing anything but a tag expression.

    An unspecified filter type counts as TAG and an empty expression as `*`,
    as in RocketMQ's proxy. Unlike RocketMQ, an empty alternative
    (`TagA ||`) is refused rather than silently dropped: it is almost
    certainly a typo that would otherwise narrow the subscription unnoticed.
    """
    if filter_type == definition_pb2.SQL:
        raise _illegal("SQL92 filter expressions are not supported")
    if filter_type not in (definition_pb2.TAG, definition_pb2.FILTER_TYPE_UNSPECIFIED):
        raise _illegal(f"unknown filter type {filter_type}")
    text = expression.strip()
    if text in ("", SUBSCRIBE_ALL):
        return MATCH_ALL
    tags = [part.strip() for part in text.split(ALTERNATIVE_SEPARATOR)]
    for tag in tags:
        _check_alternative(tag, expression)
    return TagFilter.of(frozenset(tags))


def _check_alternative(tag: str, expression: str) -> None:
    if not tag:
        raise _illegal(f"empty tag in {expression!r}")
    if tag == SUBSCRIBE_ALL:
        raise _illegal(f"'*' cannot be combined with tags in {expression!r}")
    if "|" in tag:
        raise _illegal(f"tags are separated by '||' and cannot contain '|': {expression!r}")
    if contains_control_character(tag):
        raise _illegal(f"control character in {expression!r}")


def _illegal(reason: str) -> BrokerError:
    return BrokerError(definition_pb2.ILLEGAL_FILTER_EXPRESSION, f"{reason}; {SUPPORTED}")
