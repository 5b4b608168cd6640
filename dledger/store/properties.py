"""Small Java-properties files written atomically: `currterm` and `checkpoint`.

DLedger writes these without fsync and with a delete-then-rename that can lose
the file. Here: write a temp file, fsync it, rename over the old one, fsync the
directory. A reader sees the old file or the new one, never a torn one.
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterable


def write_properties(path: str, values: dict[str, str]) -> None:
    write_atomic(path, properties_text(values))


def properties_text(values: dict[str, str]) -> bytes:
    return "".join(f"{key}={value}\n" for key, value in values.items()).encode("utf-8")


def write_atomic(path: str, data: bytes | Iterable[bytes]) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync the directory."""
    os.replace(write_temp(path, data), path)
    fsync_dir(os.path.dirname(path) or ".")


def write_temp(path: str, data: bytes | Iterable[bytes], mode: int = 0o644) -> str:
    """Write `data` (bytes, or chunks of it) to a new temp file beside `path`,
    fsync it, return its name. Each call gets its own file: a writer in a
    thread that outlived its cancelled task must not rename another writer's
    half-written file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def read_properties(path: str) -> dict[str, str]:
    values: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("!"):
                continue
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
