"""First row wins: a key keeps the first row ever written; the changelog is insert-only.

As in Fluss: partial updates are refused, and -U / -D rows are ignored (the table's delete behavior
defaults to ``ignore``; ``disable`` refuses them).
"""

from __future__ import annotations

import numpy as np

from flightstore.kv.merge.base import MergeInput, MergeResult, RowMerger, first_index, is_upsert

__all__ = ["FirstRowMerger"]


class FirstRowMerger(RowMerger):
    name = "first_row"
    supports_partial_update = False

    def merge(self, inp: MergeInput) -> MergeResult:
        first = first_index(inp.group, inp.num_groups, is_upsert(inp.kinds))
        source = np.where(inp.found, -1, first)  # stored keys never change
        new = self._overlay(inp, source, np.zeros(inp.num_groups, dtype=bool))
        return MergeResult(new, inp.found | (first >= 0))
