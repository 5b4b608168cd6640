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


def _raise(name: str) -> None:
    code = _ERRNOS.get(name, errno.EIO)
    raise OSError(code, f"{os.strerror(code)} (failpoint {name})")
