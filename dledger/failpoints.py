"""Failpoints: named places in the real code where a test makes an operation
fail the way a disk can (etcd's gofail, for this codebase).

A failpoint fires, raising OSError with its errno, when it is armed:
- in-process, by `arm(name, scope, times)` (unit tests; `scope` names the node,
  since the nodes of an in-memory cluster share one process);
- for a node process, by a file named after it in the directory given by the
  environment variable DLEDGER_FAILPOINTS_DIR (the chaos harness touches
  `<dir>/fsync` to make that node's next fdatasync fail once; the file is
  removed when it fires).

With neither, `fire` costs one dict lookup and one attribute check, so the
calls stay in production code.

`record` is the other direction: with the directory set, the node writes a
value the harness needs and cannot see from outside (the position up to
which its data is really fsynced, so that a torn-tail fault cuts only what
was never acknowledged). Without it, `record` returns at once.
"""
from __future__ import annotations

import errno
import os
import threading

FSYNC = "fsync"   # Segment.sync: fdatasync of a data or index segment

ENV_DIR = "DLEDGER_FAILPOINTS_DIR"
_ERRNOS = {FSYNC: errno.EIO}

_lock = threading.Lock()
_armed: dict[tuple[str, str], int] = {}   # (name, scope) -> times left
_directory = os.environ.get(ENV_DIR) or None


def arm(name: str, scope: str = "", times: int = 1) -> None:
    with _lock:
        _armed[(name, scope)] = times


def disarm_all() -> None:
    with _lock:
        _armed.clear()


def fire(name: str, scope: str = "") -> None:
    """Raise the failpoint's OSError if it is armed for `scope` (or for every scope)."""
    if _armed:
        with _lock:
            for key in ((name, scope), (name, "")):
                left = _armed.get(key, 0)
                if left > 0:
                    _armed[key] = left - 1
                    _raise(name)
    if _directory is not None:
        path = os.path.join(_directory, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        _raise(name)


FLUSHED_POSITION = "flushed-position"   # the data position up to which fdatasync returned

_recorded: dict[str, int] = {}   # name -> fd of its file


def record(name: str, value: int) -> None:
    """Overwrite `<dir>/<name>` with `value` (no fsync: the harness reads it
    after SIGKILL, which leaves the page cache alone)."""
    if _directory is None:
        return
    fd = _recorded.get(name)
    if fd is None:
        fd = _recorded[name] = os.open(os.path.join(_directory, name), os.O_RDWR | os.O_CREAT, 0o644)
    text = b"%020d\n" % value
    os.pwrite(fd, text, 0)


def read_recorded(directory: str, name: str) -> int | None:
    try:
        with open(os.path.join(directory, name), "rb") as file:
            return int(file.read().strip() or b"-1")
    except FileNotFoundError:
        return None


def _raise(name: str) -> None:
    code = _ERRNOS.get(name, errno.EIO)
    raise OSError(code, f"{os.strerror(code)} (failpoint {name})")
