"""The scrubber's fast check (dledger/entry.py, `verified_prefix`) finds the
same first bad entry as verify_entry walking the run, for a flipped bit
anywhere in a run (header, CRCs, body), a wrong index and a broken chain."""
from __future__ import annotations

import random

import pytest

from dledger.entry import (MAGIC_NOOP, MAGIC_NORMAL, MAGIC_PRODUCER_MARK, encode_entry, verified_prefix,
                           verify_entry)
from dledger.errors import CorruptLogError


def run(first: int, count: int, chain: int) -> tuple[bytes, int]:
    rng = random.Random(first)
    parts = []
    magics = (MAGIC_NORMAL, MAGIC_NOOP, MAGIC_PRODUCER_MARK)
    for i in range(count):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 90)))
        data, chain = encode_entry(first + i, 3, 1000 + 97 * i, body, chain, magic=magics[i % 3], channel=i % 2)
        parts.append(data)
    return b"".join(parts), chain


def reference(buf: bytes, first: int, count: int, chain: int) -> int:
    at = 0
    for i in range(count):
        try:
            header = verify_entry(buf, at, chain)
        except CorruptLogError:
            return i
        if header.index != first + i:
            return i
        chain, at = header.chain_crc, at + header.size
    return count


def test_an_intact_run_passes_whole_and_hands_on_its_chain() -> None:
    data, last_chain = run(40, 25, 0x1234)
    assert verified_prefix(data, 40, 25, 0x1234) == (25, last_chain)
    assert verified_prefix(data, 40, 10, 0x1234)[0] == 10
    assert verified_prefix(data, 41, 25, 0x1234)[0] == 0          # not the entries asked for
    assert verified_prefix(data, 40, 25, 0x1235)[0] == 0          # does not follow on from the chain given


@pytest.mark.parametrize("seed", range(4))
def test_a_flipped_bit_anywhere_is_found_at_the_same_entry_as_verify_entry_finds_it(seed: int) -> None:
    data, _ = run(7, 20, 99)
    rng = random.Random(seed)
    for position in rng.sample(range(len(data)), 150):
        damaged = bytearray(data)
        damaged[position] ^= 1 << rng.randrange(8)
        expected = reference(bytes(damaged), 7, 20, 99)
        assert expected < 20
        assert verified_prefix(bytes(damaged), 7, 20, 99)[0] == expected, position
