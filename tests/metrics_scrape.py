"""Reading the nodes' Prometheus endpoints in tests."""
from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterable


def counter_total(ports: Iterable[int], name: str, host: str = "127.0.0.1", label: str = "") -> float:
    """The sum of counter `name` (every label set, or those with `label`,
    such as 'outcome="hit"') over the /metrics of the nodes on `ports`; 0
    where a node has not counted any yet."""
    labels = rf"\{{[^}}]*{re.escape(label)}[^}}]*\}}" if label else rf"(?:\{{[^}}]*\}})?"
    pattern = re.compile(rf"^{re.escape(name)}{labels} (\S+)$", re.M)
    total = 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as answer:
            total += sum(float(value) for value in pattern.findall(answer.read().decode()))
    return total
