"""Bounded caches: one policy for every cache the library keeps, and one way to empty them.

A cache holds at most ``limit`` entries and is emptied when full (the entries are cheap to
rebuild; a retrieval service or a training step repeats a handful of signatures). Each is keyed
by everything its entries depend on (a plan's key includes the tunables it was made under).
:func:`clear_all` empties every cache, e.g. after a benchmark patched a kernel's source.
"""

from __future__ import annotations

_all: list["Cache"] = []


class Cache(dict):
    """A dict that empties itself when a new key would take it past ``limit`` entries."""

    def __init__(self, name: str, limit: int = 256):
        super().__init__()
        self.name, self.limit = name, limit
        _all.append(self)

    def put(self, key, value):
        if len(self) >= self.limit and key not in self:
            self.clear()
        self[key] = value
        return value


def clear_all() -> None:
    """Empty every cache (compiled kernels, plans, replays, tensor maps, device properties)."""
    for cache in _all:
        cache.clear()
