"""Packed columns in the state files: exact round trips, and a damaged or
short column is an error, never a silently different state."""
from __future__ import annotations

import random

import pytest

from store.packed_columns import pack_ints, pack_json, unpack_ints, unpack_json


@pytest.mark.parametrize("delta", [False, True])
def test_integers_come_back_exactly_whatever_their_order_sign_or_size(delta: bool):
    rng = random.Random(11)
    values = [rng.randint(-(1 << 62), 1 << 62) for _ in range(500)] + list(range(1000)) + [0, -1, 7, 7, 7]
    assert unpack_ints(pack_ints(values, delta=delta), len(values), delta=delta) == values
    assert unpack_ints(pack_ints([], delta=delta), 0, delta=delta) == []


def test_a_rising_column_of_a_million_packs_into_tens_of_kilobytes():
    offsets = list(range(1_000_000))
    packed = pack_ints(offsets, delta=True)
    assert len(packed) < 64 * 1024          # 8 MB as int64s
    assert unpack_ints(packed, len(offsets), delta=True) == offsets


def test_strings_and_nulls_come_back_exactly():
    values = ["a", None, "ü€", "", "x" * 300, None]
    assert unpack_json(pack_json(values)) == values


def test_a_damaged_or_short_column_is_a_value_error():
    packed = pack_ints([1, 2, 3])
    with pytest.raises(ValueError, match="holds 3 values, not 4"):
        unpack_ints(packed, 4)
    with pytest.raises(ValueError, match="damaged"):
        unpack_ints(packed[:-6] + "AAAA", 3)
    with pytest.raises(ValueError, match="damaged"):
        unpack_ints("not base64 at all!", 3)
    with pytest.raises(ValueError, match="damaged"):
        unpack_json("é")
