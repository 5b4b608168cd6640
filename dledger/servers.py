"""Server lists as users give them (`--servers host:port,...`), apart from
the log client: node start-up and the CLI's argument types parse them
without importing the client."""
from __future__ import annotations

from typing import Iterable


def parse_servers(text: str | Iterable[str]) -> list[str]:
    """`host:port,host:port` (or an iterable of them) -> a de-duplicated list."""
    items = text.split(",") if isinstance(text, str) else list(text)
    servers: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"server {item!r}: expected HOST:PORT")
        if item not in servers:
            servers.append(item)
    if not servers:
        raise ValueError("no servers given")
    return servers
