"""A digest of one stopped node's derived broker state, to compare replicas
after a chaos run: every ConsumeQueue (its units, trailing unwritten space
left out), the consumer offsets and the pop state (in-flight leases, scan
frontiers, held-back FIFO messages), each as a hash of its content.

Everything digested is a function of the committed log alone, so nodes that
applied the same log must agree item by item; the JSON files are compared
as parsed data (key order and formatting aside), without the fields that
say when or where the file was written.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CQ_UNIT = 20
# Fields of a snapshot file that say when it was written, not what it holds.
WRITE_FIELDS = {"dataVersion", "savedAt", "writtenAt", "timestamp"}
FILES = ("consumerOffset.json", "popState.json", "subscriptionGroup.json")


def digest_node(node_dir: Path) -> dict[str, str]:
    store = node_dir / "store"
    digests: dict[str, str] = {}
    consume_queues = store / "consumequeue"
    if consume_queues.is_dir():
        for queue_dir in sorted(p for p in consume_queues.glob("*/*") if p.is_dir()):
            content = b"".join(f.read_bytes() for f in sorted(queue_dir.iterdir()) if f.is_file())
            units = content.rstrip(b"\0")
            units += b"\0" * (-len(units) % CQ_UNIT)
            digests[f"consumequeue/{queue_dir.parent.name}/{queue_dir.name}"] = hashlib.sha1(units).hexdigest()
    for name in FILES:
        path = store / "config" / name
        if path.is_file():
            digests[f"config/{name}"] = hashlib.sha1(canonical(json.loads(path.read_text())).encode()).hexdigest()
    return digests


def canonical(data: Any) -> str:
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in WRITE_FIELDS}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
