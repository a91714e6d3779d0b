"""A bounded, thread-safe LRU map: every cache of plans, templates and schemas is one of these.

A cache keyed by client text (SQL, literals) must not grow with the number of distinct texts a
server ever sees; :class:`LruCache` keeps at most ``maxsize`` entries (the ``sql.cache.entries``
option) and forgets the least recently used first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``maxsize`` entries; :meth:`get` refreshes an entry, :meth:`put` evicts the least
    recently used one when full."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("an LRU cache holds at least one entry")
        self.maxsize = maxsize
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            value = self._entries.get(key, default)
            if value is not default:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
