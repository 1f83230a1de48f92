"""One copy of each string that repeats across the indexes' records, in a table of bounded size.

Every replica indexes every pod and node of the cluster, and most of what a record holds repeats
from record to record: namespaces, label keys and values, node names, phases, container names.
Decoded from JSON, each is its own object; shared, the index holds one (docs/operator.md, "Indexes
under bad input and failures").

Not ``sys.intern``: the strings come from tenants' objects, and on CPython 3.12 (the operator
image's) an interned string is never freed. Interning a million distinct 60-character strings and
dropping them all left the process 138.8 MiB larger on 3.12.1, against 16.6 MiB on 3.11.7 and
3.13.0. This table forgets everything when it is full, so what it holds is bounded whatever the
input; a record keeps the copy it was given, and strings seen after a reset are shared again.

Whole values repeat too: the labels of a Deployment's pods, the ``fiar.io/decision`` of the pods on
one node, what the containers of one pod template give a record. ``Kept`` holds one copy of each,
bounded in entries and in bytes the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, Generic, TypeVar

ENTRIES: Final = 1 << 16
"""Strings the table holds at most before it starts over."""
BYTES: Final = 8 * 1024 * 1024
"""Bytes of strings it holds at most before it starts over (``sys.getsizeof``: a character outside
Latin-1 takes 2 or 4 bytes); with the table's own 65,536 slots, about 11 MiB at worst."""
LONGEST: Final = 316
"""Longer strings are never shared (a label key is at most 253 + 1 + 63 characters)."""


class Shared:
    """``shared(value)``: ``value`` as a string, the copy already held when the table has one."""

    def __init__(self, entries: int = ENTRIES, size: int = BYTES, longest: int = LONGEST) -> None:
        self.entries, self.size, self.longest = entries, size, longest
        self._table: dict[str, str] = {}
        self._held = 0

    def __call__(self, value: object) -> str:
        text = value if type(value) is str else str(value)
        if len(text) > self.longest:
            return text
        found = self._table.get(text)
        if found is not None:
            return found
        size = sys.getsizeof(text)
        if len(self._table) >= self.entries or self._held + size > self.size:
            self._table, self._held = {}, 0  # a thread still adding to the old table adds to nothing
        self._table[text] = text
        self._held += size
        return text

    def __len__(self) -> int:
        return len(self._table)


SHARED: Final = Shared()
"""The table of the process's indexes."""


def shared_strings(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A map of labels as strings, keys and values from ``SHARED``."""
    return {SHARED(k): SHARED(v) for k, v in raw.items()}


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    """``kept(key, make, size)``: the value kept for ``key``, else ``make(key)``, kept from then on.

    Bounded like ``Shared``: the table starts over when it holds ``entries`` values or the sizes
    given with them (the caller's estimate in bytes) pass ``size``; a value of ``size`` or more is made and
    never kept. A holder of a value must never change it (records are immutable, and so are what
    they hold)."""

    def __init__(self, entries: int, size: int) -> None:
        self.entries, self.size = entries, size
        self._table: dict[K, V] = {}
        self._held = 0

    def __call__(self, key: K, make: Callable[[K], V], size: int = 0) -> V:
        try:
            return self._table[key]
        except KeyError:
            pass
        value = make(key)
        if size >= self.size:
            return value
        if len(self._table) >= self.entries or self._held + size > self.size:
            self._table, self._held = {}, 0
        self._table[key] = value
        self._held += size
        return value

    def __len__(self) -> int:
        return len(self._table)
