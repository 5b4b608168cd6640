"""ProducerTable: which idempotent appends the log already holds.

A client that wants its retries to be harmless names itself with a producer id
and numbers its append requests 0, 1, 2, ... The leader appends one
PRODUCER_MARK entry carrying (producer id, sequence, count) followed by the
request's bodies, and commits such a batch only whole (the commit index never
stops inside one, and a new leader drops a torn batch at the end of its log),
so a committed mark names exactly the `count` entries after it.

Every node feeds the marks of its committed entries, in index order, into this
table, so the table is a pure function of the committed log: identical on all
replicas, and complete on a new leader once its first entry is committed. Per
producer it keeps a window of the most recent sequences (a client never has
more requests outstanding than that); the least recently active producers are
forgotten beyond a fixed number, decided by log order alone so that replicas
forget the same ones.
"""
from __future__ import annotations

import json
import struct
from collections import OrderedDict
from dataclasses import dataclass

from dledger.errors import DLedgerError, ResponseCode

_MARK = struct.Struct(">qi")  # sequence, count; the producer id follows as UTF-8
MAX_PRODUCER_ID_BYTES = 128

# Sequences remembered per producer: well above the requests a client keeps
# in flight (dledger/client.py sends at most a handful at once).
DEFAULT_WINDOW = 256
DEFAULT_MAX_PRODUCERS = 10_000


def encode_mark(producer_id: str, sequence: int, count: int) -> bytes:
    return _MARK.pack(sequence, count) + producer_id.encode("utf-8")


def decode_mark(body: bytes) -> tuple[str, int, int]:
    """(producer id, sequence, count) of a PRODUCER_MARK entry's body."""
    if len(body) < _MARK.size:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"producer mark of {len(body)} bytes is too short")
    sequence, count = _MARK.unpack_from(body)
    return body[_MARK.size:].decode("utf-8"), sequence, count


def check_producer_request(producer_id: str, sequence: int) -> None:
    if len(producer_id.encode("utf-8")) > MAX_PRODUCER_ID_BYTES:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"producer id longer than {MAX_PRODUCER_ID_BYTES} bytes")
    if producer_id and sequence < 0:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"sequence {sequence} is negative")


@dataclass(frozen=True)
class AppendedRange:
    """Where an idempotent append's bodies landed (its mark just before them)."""
    first_index: int
    last_index: int

    @property
    def mark_index(self) -> int:
        return self.first_index - 1


@dataclass
class _Producer:
    appends: "OrderedDict[int, AppendedRange]"  # sequence -> range, oldest first
    forgotten_below: int = 0                      # sequences below this were dropped


class ProducerTable:
    def __init__(self, window: int = DEFAULT_WINDOW, max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        self.window = window
        self.max_producers = max_producers
        self.applied_index = -1
        self._producers: OrderedDict[str, _Producer] = OrderedDict()  # least recently active first

    def __len__(self) -> int:
        return len(self._producers)

    def apply_mark(self, mark_index: int, producer_id: str, sequence: int, count: int) -> None:
        """Record a committed mark (called in index order)."""
        producer = self._producers.pop(producer_id, None) or _Producer(OrderedDict())
        self._producers[producer_id] = producer
        producer.appends[sequence] = AppendedRange(mark_index + 1, mark_index + count)
        while len(producer.appends) > self.window:
            dropped, _ = producer.appends.popitem(last=False)
            producer.forgotten_below = max(producer.forgotten_below, dropped + 1)
        while len(self._producers) > self.max_producers:
            self._producers.popitem(last=False)

    def advance(self, index: int) -> None:
        self.applied_index = max(self.applied_index, index)

    def lookup(self, producer_id: str, sequence: int) -> AppendedRange | None:
        """The range of an append already in the log, None for a new one.
        Raises REPEATED_REQUEST for a sequence older than the window: it may be
        in the log, and appending it again could duplicate it."""
        producer = self._producers.get(producer_id)
        if producer is None:
            return None
        found = producer.appends.get(sequence)
        if found is None and sequence < producer.forgotten_below:
            raise DLedgerError(ResponseCode.REPEATED_REQUEST,
                               f"sequence {sequence} of producer {producer_id!r} is older than the "
                               f"{self.window} remembered; its outcome is unknown")
        return found

    # ------------------------------------------------------------ snapshot
    def to_json(self) -> str:
        return json.dumps({
            "appliedIndex": self.applied_index,
            "producers": [[pid, p.forgotten_below, [[s, r.first_index, r.last_index] for s, r in p.appends.items()]]
                          for pid, p in self._producers.items()],
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, window: int = DEFAULT_WINDOW,
                  max_producers: int = DEFAULT_MAX_PRODUCERS) -> "ProducerTable":
        data = json.loads(text)
        table = cls(window, max_producers)
        table.applied_index = int(data["appliedIndex"])
        for pid, forgotten_below, appends in data["producers"]:
            table._producers[pid] = _Producer(
                OrderedDict((int(s), AppendedRange(int(f), int(last))) for s, f, last in appends),
                int(forgotten_below))
        return table
