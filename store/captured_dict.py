"""A dict's content as of one moment, copied later, off the event loop,
while the dict keeps changing on the loop.

A metadata snapshot (or a state file) must hold a manager's state exactly as
of one applied entry. Copying a million-entry lease table with `dict.copy` at
that moment held the event loop for 35-130 ms. Instead, the owner of the dict
*begins* a capture at that moment (O(1) on the loop) and, from then on, tells
it about every key before changing that key (`before_change`): the capture
keeps the key's value as of its beginning, the first time only (an undo
journal). A worker thread then copies the live dict in slices and puts the
journalled values back over what changed meanwhile.

Why the copy is exact, with the GIL as the only synchronisation: each slice
is read in one C call (atomic with respect to the loop); a key whose value
in the live dict differs from its value at the beginning was changed after
the beginning, so its journal entry was made before that change, so before
the worker read it; the worker copies the journal only after its last read,
and the journal's entries never change once made. Keys added after the
beginning are journalled as ABSENT and dropped; keys deleted are journalled
with their value and put back.

The values must not be changed in place (replace them), as the worker reads
the objects themselves. What stays atomic in the worker is one `list(live)`
(10-20 ms for a million keys on this machine), not a copy of the dict.
"""
from __future__ import annotations

from typing import Any, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ABSENT: Any = object()   # a journalled key that was not in the dict at the beginning

# Keys read per C call in the worker: each call holds the GIL (and so the
# event loop) for a few milliseconds, not for the whole dict.
SLICE = 65_536


class DictCapture(Generic[K, V]):
    """See the module's docstring. `before_change` runs on the loop (the
    dict's owner calls it); `copy` runs anywhere, once."""

    __slots__ = ("live", "journal", "finished")

    def __init__(self, live: dict[K, V]) -> None:
        self.live = live
        self.journal: dict[K, V] = {}
        # Set by `copy`: the owner stops journalling for it (on the loop,
        # the next time it changes a key; `copy` itself never touches the owner).
        self.finished = False

    def before_change(self, key: K) -> None:
        journal = self.journal
        if key not in journal:
            journal[key] = self.live.get(key, ABSENT)

    def copy(self) -> dict[K, V]:
        """The dict as it was at the beginning (a new dict)."""
        live = self.live
        keys = list(live)
        view: dict[K, V] = {}
        for start in range(0, len(keys), SLICE):
            part = keys[start:start + SLICE]
            view.update(zip(part, map(live.get, part)))
        changed = self.journal.copy()   # one C call, after the last read: see the module's docstring
        self.finished = True
        for key, value in changed.items():
            if value is ABSENT:
                view.pop(key, None)
            else:
                view[key] = value
        return view
