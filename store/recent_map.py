"""RecentMap: the last N keys put, for lookups, as plain dicts.

State that remembers "the last 100,000 of something" was an OrderedDict
trimmed from its front. A full garbage collection walks an OrderedDict's
every link (26 ms for 200,000 ints on an idle machine; over 100 ms on a busy
2-core one once its values were objects too), and it runs on the event loop:
a leader's heartbeats waited that long. A plain dict whose keys and values
the collector does not track (ints, strs, tuples of them) is itself left
untracked, so this map keeps a few plain dicts, each holding a slice of the
puts, newest last, and drops the oldest slice whole.

It holds at least the last `capacity` keys put and at most a slice more; a
lookup looks newest first. What it holds is a function of the sequence of
puts alone (replicas that apply the same entries hold the same map).
"""
from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

SLICES = 4


class RecentMap(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slice = max(1, capacity // SLICES)
        self._dicts: deque[dict[K, V]] = deque([{}])

    def put(self, key: K, value: V) -> None:
        newest = self._dicts[-1]
        if len(newest) >= self._slice:
            newest = {}
            self._dicts.append(newest)
            if len(self._dicts) > SLICES + 1:
                self._dicts.popleft()
        newest[key] = value

    def get(self, key: K) -> V | None:
        for held in reversed(self._dicts):
            value = held.get(key)
            if value is not None:
                return value
        return None
