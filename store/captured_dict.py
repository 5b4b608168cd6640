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

import weakref
from bisect import bisect_left
from itertools import filterfalse
from typing import Any, Generic, Hashable, TypeVar

from store.slices import SLICE, breathe, map_in_slices, sorted_in_slices

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ABSENT: Any = object()   # a journalled key that was not in the dict at the beginning



class DictCapture(Generic[K, V]):
    """See the module's docstring. `before_change` runs on the loop (the
    dict's owner calls it); `copy` runs anywhere, once."""

    __slots__ = ("live", "journal", "finished", "__weakref__")

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
        """The dict as it was at the beginning (a new dict, in key order)."""
        keys, values = self.sorted_items()
        view: dict[K, V] = {}
        for start in range(0, len(keys), SLICE):
            view.update(zip(keys[start:start + SLICE], values[start:start + SLICE]))
            breathe()
        return view

    def sorted_items(self) -> tuple[list[K], list[V]]:
        """The dict as it was at the beginning, as its keys in order and
        their values. No dict is built (growing one to a million entries
        resizes it in single C calls of 30-40 ms), and the keys are listed
        once: the one C call over the whole dict left (`list(live)`)."""
        live = self.live
        keys = list(live)
        # Keys added since the beginning go; keys deleted come back. (Keys
        # deleted after this look keep their place: their values are
        # journalled, below.)
        changed = self.journal.copy()
        added = {key for key, value in changed.items() if value is ABSENT}
        if added:
            keys = [key for start in range(0, len(keys), SLICE)
                    for key in filterfalse(added.__contains__, keys[start:start + SLICE])]
        keys = sorted_in_slices(keys)
        deleted = [key for key in sorted(key for key, value in changed.items() if value is not ABSENT)
                   if not _holds(keys, key)]
        if deleted:
            keys = _merged(keys, deleted)
        values = map_in_slices(live.get, keys)
        changed = self.journal.copy()   # after the last read: see the module's docstring
        self.finished = True
        for key, value in changed.items():
            if value is not ABSENT:
                at = bisect_left(keys, key)
                if at < len(keys) and keys[at] == key:
                    values[at] = value
        return keys, values


def _holds(ordered: list[Any], key: Any) -> bool:
    at = bisect_left(ordered, key)
    return at < len(ordered) and ordered[at] == key


def _merged(ordered: list[Any], more: list[Any]) -> list[Any]:
    """Two sorted lists as one, `more` short: copies slices, no per-key step."""
    merged: list[Any] = []
    previous = 0
    for key in more:
        at = bisect_left(ordered, key, previous)
        merged.extend(ordered[previous:at])
        merged.append(key)
        previous = at
    merged.extend(ordered[previous:])
    return merged


class Captures:
    """The captures begun on one dict and not yet copied, for its owner:
    `begin` one when a snapshot is taken, call `before_change(key)` before
    every change of the dict (nothing to do while there is none) and `clear`
    when the dict is replaced. Held weakly: a capture nobody will copy stops
    being journalled once it is dropped."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: tuple[weakref.ref[DictCapture[Any, Any]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self._refs)

    def begin(self, live: dict[K, V]) -> DictCapture[K, V]:
        capture = DictCapture(live)
        self._refs = tuple(ref for ref in self._refs if _pending(ref)) + (weakref.ref(capture),)
        return capture

    def before_change(self, key: Any) -> None:
        stale = False
        for ref in self._refs:
            capture = ref()
            if capture is None or capture.finished:
                stale = True
            else:
                capture.before_change(key)
        if stale:
            self._refs = tuple(ref for ref in self._refs if _pending(ref))

    def clear(self) -> None:
        """The owner replaced the dict: the captures hold the old one, which
        nothing changes any more."""
        self._refs = ()


def _pending(ref: weakref.ref[DictCapture[Any, Any]]) -> bool:
    capture = ref()
    return capture is not None and not capture.finished
