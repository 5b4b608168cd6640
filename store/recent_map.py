"""RecentMap: the keys put at the last N positions, for lookups, as plain dicts.

State that remembers "the last 100,000 of something" was an OrderedDict
trimmed from its front. A full garbage collection walks an OrderedDict's
every link (26 ms for 200,000 ints on an idle machine; over 100 ms on a busy
2-core one once its values were objects too), and it runs on the event loop:
a leader's heartbeats waited that long. A plain dict whose keys and values
the collector does not track (ints, strs, tuples of them) is itself left
untracked, so this map keeps a few plain dicts ("slices"), each holding the
puts of a quarter of the window, newest last, and drops the oldest slice
whole once the window has moved past it.

A put's position is what the caller gives (the message id table gives each
message's entry index: "the ids of the last 200,000 entries") or, by
default, the count of puts so far ("the last 100,000 leases ended").
Positions only grow. The map holds every put of the last `capacity`
positions and at most a slice more: a caller that needs the window exactly
checks the position it keeps in the value (MessageIdTable does). What it
holds is a function of the sequence of puts alone (replicas that apply the
same entries hold the same map).
"""
from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

SLICES = 4


class RecentMap(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._span = max(1, capacity // SLICES)
        # (first position, its dict), newest last.
        self._slices: deque[tuple[int, dict[K, V]]] = deque()
        self.latest = -1          # the newest put's position
        self._puts = 0

    def put(self, key: K, value: V, position: int | None = None) -> None:
        if position is None:
            position = self._puts
        self._puts += 1
        slices = self._slices
        if not slices or position - slices[-1][0] >= self._span:
            slices.append((position, {}))
        slices[-1][1][key] = value
        self.latest = position   # positions only grow
        self._drop_old()

    def get(self, key: K) -> V | None:
        """The newest value put for `key`, if the map still holds it."""
        for _, held in reversed(self._slices):
            value = held.get(key)
            if value is not None:
                return value
        return None

    def items(self) -> Iterator[tuple[K, V]]:
        """Everything held, oldest slice first (a key put again appears
        again, later)."""
        for _, held in self._slices:
            yield from held.items()

    def prepend(self, first_position: int, older: dict[K, V], last_position: int) -> None:
        """A slice of puts made before every one held (`first_position` ..
        `last_position`), such as ids read back from the log at start."""
        if not older:
            return
        self._slices.appendleft((first_position, older))
        self.latest = max(self.latest, last_position)
        self._drop_old()

    def _drop_old(self) -> None:
        """The oldest slice goes once the next one begins inside the window."""
        slices = self._slices
        while len(slices) > 1 and slices[1][0] <= self.latest - self.capacity + 1:
            slices.popleft()
