"""Which schema version wrote which offsets of one log, so old records read under a new schema.

ALTER TABLE never rewrites a log: after ``ADD COLUMN`` the records written before keep their
columns. A log directory's ``schemas.json`` records its *schema epochs*, ``[[version, from_offset],
...]`` in offset order: records from ``from_offset`` on were written under ``version`` (until the next
epoch). A reader finds a record's version by bisection on its base offset, decodes it against that
version's schema and conforms it to the current one (:func:`flightstore.schema.conform`: columns added later are
NULL, widened
columns are cast).

Durability: an epoch is written (atomically: temporary file, fsync, rename, fsync of the directory)
*before* the first record of its version is appended, under the log's append lock. A log opened at a
version newer than its last epoch had nothing appended since (the catalog commits a schema change
before any writer can use it), so the new epoch starts at the log's end. A log without the file
that holds records predates schema versions: its records are version 1.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from flightstore.errors import CorruptData

__all__ = ["EPOCHS_FILE", "SchemaEpochs", "needed_indices"]

EPOCHS_FILE = "schemas.json"


class SchemaEpochs:
    """The schema epochs of one log directory (thread-safety: the log's append lock)."""

    def __init__(self, directory: Path, version: int, end_offset: int, has_records: bool,
                 fsync: bool = True) -> None:
        self._file = Path(directory) / EPOCHS_FILE
        self._fsync = fsync
        if self._file.exists():
            try:
                epochs = [(int(v), int(o)) for v, o in json.loads(self._file.read_text("utf-8"))]
            except (ValueError, TypeError) as exc:
                raise CorruptData(f"{self._file}: unreadable schema epochs: {exc}") from None
            if not epochs or any(b[0] < a[0] or b[1] < a[1] for a, b in itertools.pairwise(epochs)):
                raise CorruptData(f"{self._file}: schema epochs out of order: {epochs}")
            if epochs[-1][0] > version:
                raise CorruptData(f"{self._file}: the log holds records of schema version "
                                  f"{epochs[-1][0]} but the catalog knows version {version}")
            self._epochs = epochs
            self._offsets = [o for _, o in epochs]
        else:
            self._epochs = [(1 if has_records else version, 0)]
            self._save()
        if self._epochs[-1][0] < version:
            self.begin(version, end_offset)

    @property
    def epochs(self) -> list[tuple[int, int]]:
        return list(self._epochs)

    @property
    def versions(self) -> set[int]:
        return {v for v, _ in self._epochs}

    def version_at(self, offset: int) -> int:
        """The schema version that wrote the record starting at ``offset``."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        return self._epochs[max(index, 0)][0]

    def begin(self, version: int, from_offset: int) -> None:
        """Records from ``from_offset`` on are written under ``version`` (durable on return)."""
        if version == self._epochs[-1][0]:
            return
        if version < self._epochs[-1][0] or from_offset < self._epochs[-1][1]:
            raise CorruptData(f"{self._file}: schema version {version} at offset {from_offset} "
                              f"after {self._epochs[-1]}")
        self._epochs = self._epochs + [(version, from_offset)]
        self._save()

    def place(self, version: int, from_offset: int) -> None:
        """Records from ``from_offset`` (the log's end) on are ``version``, as a replicated record
        says: an epoch that holds no record yet is replaced (a follower's catalog may have begun
        one its leader had not reached at that offset)."""
        epochs = list(self._epochs)
        if epochs[-1][1] >= from_offset:
            epochs = [e for e in epochs if e[1] < from_offset] or []
        if not epochs or epochs[-1][0] != version:
            if epochs and version < epochs[-1][0]:
                raise CorruptData(f"{self._file}: schema version {version} at offset {from_offset} "
                                  f"after {epochs[-1]}")
            epochs.append((version, from_offset if epochs else 0))
        self._epochs = epochs
        self._save()

    def truncate_from(self, offset: int) -> None:
        """Forget epochs that begin past ``offset`` (the log was cut there)."""
        kept = [e for e in self._epochs if e[1] <= offset] or self._epochs[:1]
        if kept != self._epochs:
            self._epochs = kept
            self._save()

    def _save(self) -> None:
        self._offsets = [o for _, o in self._epochs]
        tmp = self._file.with_suffix(".tmp")
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self._epochs, handle)
            handle.flush()
            if self._fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, self._file)
        if self._fsync:
            fd = os.open(self._file.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def needed_indices(schema: pa.Schema, needed: Mapping[str, object] | set[str]) -> list[int]:
    """Positions in ``schema`` of the ``needed`` columns it has."""
    return [i for i, name in enumerate(schema.names) if name in needed]
