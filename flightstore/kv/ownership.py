"""Column ownership: several writers fill one wide table with partial updates on disjoint columns.

Each writer claims the non-key columns it writes. A claim is *live* until its writer releases it or
stops heartbeating for ``ttl`` seconds; a writer that claims a column another live writer holds gets
:class:`~flightstore.errors.WriterConflict` naming the column and the owner. Claims are all or
nothing, re-claiming one's own columns refreshes them, and an expired claim is taken over silently
(the crashed writer's replacement can start without waiting for a release).

The registry is in memory, one per table handle (:func:`ownership_of`): it guards the writers of
one server process, which is where all writes of a table land. The helpers below take any object
with the table's ``ownership``, ``schema``, ``descriptor`` and ``path`` (:class:`OwnedTable`), so
this module needs nothing from the store above it. Writers that expire
(``table.writer-id.expiration``) have their claims released by the table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from flightstore.errors import InvalidInput, WriterConflict
from flightstore.schema import TableDescriptor

__all__ = [
    "DEFAULT_TTL_SECONDS",
    "Claim",
    "ColumnOwnership",
    "OwnedTable",
    "claim_columns",
    "ownership_of",
    "release_columns",
]

DEFAULT_TTL_SECONDS = 30.0


@dataclass
class Claim:
    """The columns a writer holds and when its claim expires (clock seconds)."""

    writer_id: str
    columns: frozenset[str]
    expires_at: float


class ColumnOwnership:
    """Which live writer owns which column. Thread-safe; ``clock`` is injectable for tests."""

    def __init__(self, default_ttl: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.default_ttl = default_ttl
        self._clock = clock
        self._claims: dict[str, Claim] = {}
        self._lock = threading.Lock()

    def _live(self) -> dict[str, Claim]:
        now = self._clock()
        for writer in [w for w, c in self._claims.items() if c.expires_at <= now]:
            del self._claims[writer]
        return self._claims

    def claim(self, writer_id: str, columns: Iterable[str], ttl: float | None = None) -> None:
        """Add ``columns`` to ``writer_id``'s claim (and refresh it), or raise WriterConflict."""
        wanted = frozenset(columns)
        with self._lock:
            claims = self._live()
            for other, claim in claims.items():
                taken = sorted(wanted & claim.columns) if other != writer_id else []
                if taken:
                    raise WriterConflict(f"column {taken[0]!r} is owned by live writer {other!r}; "
                                         f"writer {writer_id!r} cannot write it")
            held = claims[writer_id].columns if writer_id in claims else frozenset()
            expires = self._clock() + (self.default_ttl if ttl is None else ttl)
            claims[writer_id] = Claim(writer_id, held | wanted, expires)

    def heartbeat(self, writer_id: str, ttl: float | None = None) -> bool:
        """Keep ``writer_id``'s claim live; False if it has none (expired or released)."""
        with self._lock:
            claim = self._live().get(writer_id)
            if claim is None:
                return False
            claim.expires_at = self._clock() + (self.default_ttl if ttl is None else ttl)
            return True

    def release(self, writer_id: str, columns: Iterable[str] | None = None) -> None:
        """Give up ``columns`` (all of the writer's columns by default)."""
        with self._lock:
            claim = self._live().get(writer_id)
            if claim is None:
                return
            remaining = frozenset() if columns is None else claim.columns - frozenset(columns)
            if remaining:
                claim.columns = remaining
            else:
                del self._claims[writer_id]

    def owner(self, column: str) -> str | None:
        """The live writer owning ``column``, if any."""
        with self._lock:
            for writer, claim in self._live().items():
                if column in claim.columns:
                    return writer
            return None

    def claims(self) -> dict[str, frozenset[str]]:
        with self._lock:
            return {w: c.columns for w, c in self._live().items()}


class OwnedTable(Protocol):
    """What the helpers need of a table handle."""

    ownership: ColumnOwnership
    schema: pa.Schema
    descriptor: TableDescriptor
    path: Any


def ownership_of(table: OwnedTable) -> ColumnOwnership:
    """The ownership registry of ``table`` (it lives as long as the table handle)."""
    return table.ownership


def _value_columns(table: OwnedTable, columns: Sequence[str]) -> list[str]:
    unknown = [c for c in columns if c not in table.schema.names]
    if unknown:
        raise InvalidInput(f"table {table.path} has no column(s) {unknown}")
    return [c for c in columns if c not in table.descriptor.primary_key]


def claim_columns(table: OwnedTable, writer_id: str, columns: Sequence[str],
                  ttl: float | None = None) -> None:
    """Claim the non-key ``columns`` of ``table`` for ``writer_id`` (WriterConflict if taken)."""
    ownership_of(table).claim(writer_id, _value_columns(table, columns), ttl)


def release_columns(table: OwnedTable, writer_id: str) -> None:
    ownership_of(table).release(writer_id)
