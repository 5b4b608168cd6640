"""ProducerTable: which idempotent appends the log already holds.

A client that wants its retries to be harmless names itself with a producer id
and numbers its append requests 0, 1, 2, ... The leader appends one
PRODUCER_MARK entry carrying (producer id, sequence, count, the leader's wall
time) followed by the request's bodies, and commits such a batch only whole
(the commit index never stops inside one, and a new leader drops a torn batch
at the end of its log), so a committed mark names exactly the `count` entries
after it.

Every node feeds the marks of its committed entries, in index order, into this
table, so the table is a pure function of the committed log: identical on all
replicas, and complete on a new leader once its first entry is committed.

What it remembers is bounded, and the bound is stated (NATS JetStream's
duplicate window is the model):
- by time: a retry is recognised for `window_ms` after its first attempt
  (the client says how old a retry is). An older retry is refused with
  REPEATED_REQUEST, "outcome unknown", never appended a second time. A
  producer is forgotten once the log's time (the newest mark's) has moved
  two windows past its last mark: the second window absorbs clock
  differences between successive leaders.
- per producer: the most recent `sequences` sequence numbers (a client
  never has more requests outstanding); an older one is REPEATED_REQUEST.
- in count: at most `max_producers`. Beyond that the least recently active
  are dropped early; while one dropped that way could still retry, a retry
  from a producer the table does not know is refused (REPEATED_REQUEST)
  rather than risk a duplicate.
"""
from __future__ import annotations

import json
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from dledger.errors import DLedgerError, ResponseCode

_MARK_V1 = struct.Struct(">qi")       # sequence, count; the producer id follows as UTF-8
_MARK_V2 = struct.Struct(">BBqiq")    # 0xFF, 2, sequence, count, wall time ms; then the id
_V2_TAG = 0xFF                        # a v1 mark starts with a non-negative sequence: never 0xFF
MAX_PRODUCER_ID_BYTES = 128

# Sequences remembered per producer: well above the requests a client keeps
# in flight (dledger/client.py sends at most a handful at once).
DEFAULT_SEQUENCES = 64
DEFAULT_MAX_PRODUCERS = 10_000
DEFAULT_WINDOW_MS = 120_000           # NATS JetStream's default duplicate window


@dataclass(frozen=True)
class Mark:
    producer_id: str
    sequence: int
    count: int
    written_ms: int   # the leader's wall time; 0 in marks of older versions


def encode_mark(producer_id: str, sequence: int, count: int, written_ms: int) -> bytes:
    return _MARK_V2.pack(_V2_TAG, 2, sequence, count, written_ms) + producer_id.encode("utf-8")


def decode_mark(body: bytes) -> Mark:
    """A PRODUCER_MARK entry's body, in either version."""
    if body[:1] == bytes([_V2_TAG]):
        if len(body) < _MARK_V2.size:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"producer mark of {len(body)} bytes is too short")
        _, _, sequence, count, written_ms = _MARK_V2.unpack_from(body)
        return Mark(body[_MARK_V2.size:].decode("utf-8"), sequence, count, written_ms)
    if len(body) < _MARK_V1.size:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"producer mark of {len(body)} bytes is too short")
    sequence, count = _MARK_V1.unpack_from(body)
    return Mark(body[_MARK_V1.size:].decode("utf-8"), sequence, count, 0)


def check_producer_request(producer_id: str, sequence: int) -> None:
    if len(producer_id.encode("utf-8")) > MAX_PRODUCER_ID_BYTES:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"producer id longer than {MAX_PRODUCER_ID_BYTES} bytes")
    if producer_id and sequence < 0:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"sequence {sequence} is negative")


@dataclass(frozen=True)
class Snapshot:
    head: str                                  # the JSON object before the producers
    parts: list[str]                           # each producer's JSON, in table order
    encoded: dict[str, tuple[object, str]]     # producer -> (the copy it encoded, its JSON)

    def chunks(self, per_chunk: int = 256) -> Iterator[bytes]:
        """The file's content in pieces: joining a table at its limits (tens of
        MB) in one call would hold the GIL, and with it the event loop, for
        a tenth of a second."""
        yield f'{self.head[:-1]},"producers":['.encode()
        for start in range(0, len(self.parts), per_chunk):
            yield (("," if start else "") + ",".join(self.parts[start:start + per_chunk])).encode()
        yield b"]}"

    @property
    def text(self) -> str:
        return b"".join(self.chunks()).decode()


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
    # sequence -> (first index, last index), oldest first. Plain tuples in a
    # plain dict, not objects: the garbage collector stops tracking those
    # once it has looked at them, and a full collection runs on the event
    # loop. At the table's limits (10,000 producers x 64) the objects cost
    # each full collection 283 ms of CPU, long enough for an election.
    appends: dict[int, tuple[int, int]] = field(default_factory=dict)
    forgotten_below: int = 0      # sequences below this were dropped
    last_ms: int = 0              # the wall time of its latest mark


class ProducerTable:
    def __init__(self, sequences: int = DEFAULT_SEQUENCES, max_producers: int = DEFAULT_MAX_PRODUCERS,
                 window_ms: int = DEFAULT_WINDOW_MS) -> None:
        self.sequences = sequences
        self.max_producers = max_producers
        self.window_ms = window_ms
        self.applied_index = -1
        self.log_time_ms = 0          # the newest mark's wall time: the table's clock
        # Last activity of the latest producer dropped for the count bound; -1: none ever was.
        self.early_drop_ms = -1
        self._producers: OrderedDict[str, _Producer] = OrderedDict()  # least recently active first
        # Snapshots (see capture): producers changed since the last capture,
        # and per producer its JSON, or a copy of it not yet encoded.
        self._changed: set[str] = set()
        self._fragments: dict[str, str | tuple] = {}
        self._captured_index = -2

    def __len__(self) -> int:
        return len(self._producers)

    def apply_mark(self, mark_index: int, mark: Mark) -> None:
        """Record a committed mark (called in index order)."""
        producer = self._producers.pop(mark.producer_id, None) or _Producer()
        self._producers[mark.producer_id] = producer
        self._changed.add(mark.producer_id)
        producer.appends[mark.sequence] = (mark_index + 1, mark_index + mark.count)
        producer.last_ms = max(producer.last_ms, mark.written_ms)
        self.log_time_ms = max(self.log_time_ms, mark.written_ms)
        appends = producer.appends
        while len(appends) > self.sequences:
            dropped = next(iter(appends))
            del appends[dropped]
            producer.forgotten_below = max(producer.forgotten_below, dropped + 1)
        self._forget_old()

    def _forget_old(self) -> None:
        horizon = self.log_time_ms - 2 * self.window_ms
        while self._producers:
            producer_id, producer = next(iter(self._producers.items()))
            expired = producer.last_ms < horizon
            if not expired and len(self._producers) <= self.max_producers:
                return
            self._producers.popitem(last=False)
            self._changed.add(producer_id)
            if not expired:
                self.early_drop_ms = max(self.early_drop_ms, producer.last_ms)

    def advance(self, index: int) -> None:
        self.applied_index = max(self.applied_index, index)

    def lookup(self, producer_id: str, sequence: int, retry_age_ms: int = 0) -> AppendedRange | None:
        """The range of an append already in the log, None for a new one.
        Raises REPEATED_REQUEST when the table cannot tell: appending again
        could store it twice. `retry_age_ms`: how long ago the client first
        sent this request (0 on a first attempt)."""
        producer = self._producers.get(producer_id)
        found = producer.appends.get(sequence) if producer is not None else None
        if found is not None:
            return AppendedRange(*found)
        if producer is not None and sequence < producer.forgotten_below:
            raise self._unknown(producer_id, sequence, f"is older than the {self.sequences} sequences remembered")
        if retry_age_ms > self.window_ms:
            raise self._unknown(producer_id, sequence, f"was first sent {retry_age_ms / 1000:.1f} s ago, "
                                f"outside the {self.window_ms / 1000:.0f} s duplicate window")
        if producer is None and retry_age_ms > 0 and self.early_drop_ms >= 0 and \
                self.early_drop_ms >= self.log_time_ms - 2 * self.window_ms:
            raise self._unknown(producer_id, sequence, f"is a retry from a producer the table no longer holds "
                                f"(more than {self.max_producers} producers were active)")
        return None

    @staticmethod
    def _unknown(producer_id: str, sequence: int, why: str) -> DLedgerError:
        return DLedgerError(ResponseCode.REPEATED_REQUEST,
                            f"sequence {sequence} of producer {producer_id!r} {why}; its outcome is unknown "
                            f"and it is not appended again")

    # ------------------------------------------------------------ snapshot
    def capture(self) -> Callable[[], Snapshot] | None:
        """The table as JSON, in two steps, so that the event loop's share
        grows with what changed, not with the table: this call (on the loop)
        copies the producers changed since the last capture; the function it
        returns (run in a thread) encodes those and joins them with the JSON
        kept for every other producer. Hand its result to `keep`. None when
        nothing changed."""
        if self.applied_index == self._captured_index and not self._changed:
            return None
        self._captured_index = self.applied_index
        for pid in self._changed:
            producer = self._producers.get(pid)
            if producer is None:
                self._fragments.pop(pid, None)
            else:
                self._fragments[pid] = (pid, producer.forgotten_below, list(producer.appends.items()),
                                        producer.last_ms)
        self._changed = set()
        items = [(pid, self._fragments[pid]) for pid in self._producers]
        head = json.dumps({"appliedIndex": self.applied_index, "logTimeMs": self.log_time_ms,
                           "earlyDropMs": self.early_drop_ms}, separators=(",", ":"))

        def encode() -> Snapshot:
            encoded: dict[str, tuple[object, str]] = {}
            parts: list[str] = []
            for pid, fragment in items:
                if not isinstance(fragment, str):
                    _, forgotten_below, appends, last_ms = fragment
                    text = json.dumps([pid, forgotten_below, [[s, first, last] for s, (first, last) in appends],
                                       last_ms], separators=(",", ":"))
                    encoded[pid] = (fragment, text)
                    fragment = text
                parts.append(fragment)
            return Snapshot(head, parts, encoded)

        return encode

    def keep(self, snapshot: Snapshot) -> None:
        """On the loop: remember the JSON of producers that have not changed since."""
        for pid, (copied, text) in snapshot.encoded.items():
            if self._fragments.get(pid) is copied:
                self._fragments[pid] = text

    def to_json(self) -> str:
        self._captured_index = -2   # capture even when nothing changed
        encode = self.capture()
        assert encode is not None
        snapshot = encode()
        self.keep(snapshot)
        return snapshot.text

    @classmethod
    def from_json(cls, text: str, sequences: int = DEFAULT_SEQUENCES, max_producers: int = DEFAULT_MAX_PRODUCERS,
                  window_ms: int = DEFAULT_WINDOW_MS) -> "ProducerTable":
        data = json.loads(text)
        table = cls(sequences, max_producers, window_ms)
        table.applied_index = int(data["appliedIndex"])
        table.log_time_ms = int(data.get("logTimeMs", 0))
        table.early_drop_ms = int(data.get("earlyDropMs", -1))
        for pid, forgotten_below, appends, *rest in data["producers"]:
            table._producers[pid] = _Producer(
                {int(s): (int(f), int(last)) for s, f, last in appends},
                int(forgotten_below), int(rest[0]) if rest else 0)
        table._changed = set(table._producers)
        return table
