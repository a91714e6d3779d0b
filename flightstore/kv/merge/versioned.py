"""Versioned: a row replaces the stored one when its version column is greater or equal.

Rows with a null version never update. Within a batch the winner of a key is its last row holding
the greatest version (ties go to the later row, as sequential application would). As in Fluss,
partial updates are refused and -U / -D rows are ignored.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.kv.merge.base import MergeInput, MergeResult, RowMerger, is_upsert, last_index

__all__ = ["VersionedMerger"]


def _as_int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return pc.cast(pc.fill_null(pc.cast(column, pa.int64()), np.iinfo(np.int64).min),
                   pa.int64()).to_numpy(zero_copy_only=False)


class VersionedMerger(RowMerger):
    name = "versioned"
    supports_partial_update = False

    def __init__(self, descriptor) -> None:
        super().__init__(descriptor)
        self.version_column = descriptor.options["table.merge-engine.versioned.ver-column"]

    def merge(self, inp: MergeInput) -> MergeResult:
        versions = inp.batch.column(self.version_column)
        candidates = is_upsert(inp.kinds) & versions.is_valid().to_numpy(zero_copy_only=False)
        values = _as_int64(versions)
        # Greatest version per group, then the last row holding it.
        best = np.full(inp.num_groups, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(best, inp.group[candidates], values[candidates])
        holds_best = candidates & (values == best[inp.group])
        winner = last_index(inp.group, inp.num_groups, holds_best)
        old_versions = _as_int64(inp.old.column(self.version_column))
        old_valid = inp.old.column(self.version_column).is_valid().to_numpy(zero_copy_only=False)
        replaces = (winner >= 0) & (~inp.found | ~old_valid | (best >= old_versions))
        source = np.where(replaces, winner, -1)
        new = self._overlay(inp, source, np.zeros(inp.num_groups, dtype=bool))
        return MergeResult(new, inp.found | replaces)
