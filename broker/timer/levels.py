"""RocketMQ's delay levels: "1s 5s 10s 30s 1m ... 2h", level 1 is the first.

A 4.x producer says `setDelayTimeLevel(3)` and RocketMQ delivers 10 s after
storing the message. Over the 5.x protocol a level travels as the user
property DELAY (see broker/timer/__init__.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


@dataclass(frozen=True)
class DelayLevels:
    delays_ms: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> "DelayLevels":
        """From MessageStoreConfig.messageDelayLevel's notation, e.g. "1s 5s 1m 2h"."""
        delays = []
        for item in text.split():
            match = _LEVEL.match(item)
            if match is None:
                raise ValueError(f"delay level {item!r} is not a number followed by ms, s, m, h or d")
            delays.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
        if not delays:
            raise ValueError("no delay levels given")
        return cls(tuple(delays))

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def clamp(self, level: int) -> int:
        """RocketMQ's rule: a level above the last is the last."""
        if level < 1:
            raise ValueError(f"delay level {level} is below 1")
        return min(level, self.max_level)

    def delay_ms(self, level: int) -> int:
        return self.delays_ms[self.clamp(level) - 1]
