"""RecentMap: the last N keys put, kept as plain dicts that the garbage
collector does not walk."""
from __future__ import annotations

import gc

from store.recent_map import SLICES, RecentMap


def test_it_holds_at_least_the_last_capacity_keys_and_at_most_a_slice_more():
    recent: RecentMap[int, str] = RecentMap(capacity=100)
    for key in range(1_000):
        recent.put(key, f"v{key}")
        held = [k for k in range(key + 1) if recent.get(k) is not None]
        assert held[-min(key + 1, 100):] == list(range(max(0, key - 99), key + 1))
        assert len(held) <= 100 + 100 // SLICES
    assert recent.get(999) == "v999" and recent.get(850) is None


def test_a_key_put_again_answers_its_newest_value():
    recent: RecentMap[str, int] = RecentMap(capacity=8)
    recent.put("a", 1)
    for key in range(5):
        recent.put(f"k{key}", key)
    recent.put("a", 2)
    assert recent.get("a") == 2


def test_the_collector_leaves_a_map_of_plain_tuples_alone():
    recent: RecentMap[tuple[str, int], tuple[str, int]] = RecentMap(capacity=10_000)
    for key in range(10_000):
        recent.put(("group", key), ("acked", key))
    gc.collect()
    assert not any(gc.is_tracked(held) for _, held in recent._slices)


def test_positions_given_by_the_caller_set_the_window():
    # The message id table's use: positions are entry indexes, with gaps.
    recent: RecentMap[str, int] = RecentMap(capacity=100)
    for index in range(0, 1_000, 7):
        recent.put(f"k{index}", index, position=index)
        held = sorted(v for _, v in recent.items())
        # every put of the window, and at most a slice (plus the gap of 7) more
        assert held[0] <= max(0, index - 99) and held[0] > index - 100 - 100 // SLICES - 7
    recent.prepend(-50, {"old": -50}, -1)     # older than everything: dropped as the window has moved on
    assert recent.get("old") is None and recent.latest == 994
    fresh: RecentMap[str, int] = RecentMap(capacity=100)
    fresh.put("new", 500, position=500)
    fresh.prepend(450, {"old": 450}, 499)
    assert fresh.get("old") == 450 and [k for k, _ in fresh.items()] == ["old", "new"]
