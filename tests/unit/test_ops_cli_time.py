"""TIME arguments of the operators' commands (cluster/ops_cli.py)."""
from __future__ import annotations

import argparse

import pytest

from cluster.ops_cli import iso, time_arg

NOW = 1_795_600_000_000


def test_times_are_read_as_ms_iso_now_or_ago():
    assert time_arg("1795600000123", NOW) == 1_795_600_000_123
    assert time_arg("now", NOW) == NOW
    assert time_arg("-10m", NOW) == NOW - 600_000
    assert time_arg("-1.5h", NOW) == NOW - 5_400_000
    assert time_arg("2026-11-25T18:00:00Z", NOW) == time_arg("2026-11-25T18:00:00", NOW)   # naive is UTC
    assert time_arg("2026-11-25T19:00:00+01:00", NOW) == time_arg("2026-11-25T18:00:00Z", NOW)
    assert iso(time_arg("2026-11-25T18:00:00.250Z", NOW)) == "2026-11-25T18:00:00.250Z"


@pytest.mark.parametrize("text", ["yesterday", "-10x", "2026-13-01", ""])
def test_anything_else_is_a_usage_error(text):
    with pytest.raises(argparse.ArgumentTypeError):
        time_arg(text, NOW)
