"""Last row wins (the default engine): the newest write of a key replaces the stored row.

Within one batch only the last operation of a key matters: every operation of one write names the
same target columns, so a later upsert overwrites all of them and a later delete nulls all of them.
A partial delete nulls only the target columns and removes the row once every non-key column is null.
"""

from __future__ import annotations

import numpy as np

from flightstore.kv.merge.base import MergeInput, MergeResult, RowMerger, is_delete, is_upsert, last_index

__all__ = ["LastRowMerger"]


class LastRowMerger(RowMerger):
    name = "last_row"

    def merge(self, inp: MergeInput) -> MergeResult:
        relevant = is_upsert(inp.kinds) | is_delete(inp.kinds)
        last = last_index(inp.group, inp.num_groups, relevant)
        touched = last >= 0
        last_is_delete = np.zeros(inp.num_groups, dtype=bool)
        last_is_delete[touched] = is_delete(inp.kinds[last[touched]])
        if inp.target_columns is None:
            # A full delete removes the row; a full upsert replaces it.
            new = self._overlay(inp, last, np.zeros(inp.num_groups, dtype=bool))
            exists = np.where(touched, ~last_is_delete, inp.found)
            return MergeResult(new, exists)
        new = self._overlay(inp, last, last_is_delete)
        exists = np.where(touched & last_is_delete, inp.found & self._any_value_present(new),
                          np.where(touched, True, inp.found))
        return MergeResult(new, exists)
