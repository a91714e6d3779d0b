"""The merge-engine interface and the vectorized group helpers every engine shares.

The KV tablet groups a write batch by primary key (groups numbered by first occurrence), fetches the
stored row of every group with one multi-get, and asks the engine for the row each group holds after
the batch. Engines work on whole columns: no Python loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.errors import InvalidInput
from flightstore.schema import TableDescriptor

__all__ = ["MergeInput", "MergeResult", "RowMerger", "last_index", "first_index", "take_or_null",
           "is_upsert", "is_delete"]


@dataclass
class MergeInput:
    """One bucket's write batch, grouped by key.

    ``batch`` has every table column (columns outside ``target_columns`` are null); ``kinds`` holds
    the int8 change type of each row (+I/+U upsert, -U retract, -D delete); ``group`` maps each row
    to its key group 0..G-1; ``old`` has G rows, the stored row of each group (null where
    ``found`` is False).
    """

    batch: pa.Table
    kinds: np.ndarray
    group: np.ndarray
    num_groups: int
    old: pa.Table
    found: np.ndarray
    target_columns: tuple[str, ...] | None


@dataclass
class MergeResult:
    """The row each group holds after the batch (``new``, G rows) and whether one exists."""

    new: pa.Table
    exists: np.ndarray


def is_upsert(kinds: np.ndarray) -> np.ndarray:
    return (kinds == changetype.INSERT) | (kinds == changetype.UPDATE_AFTER) | (
        kinds == changetype.APPEND_ONLY)


def is_delete(kinds: np.ndarray) -> np.ndarray:
    return kinds == changetype.DELETE


def last_index(group: np.ndarray, num_groups: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Index of the last row of each group (restricted to ``mask``), -1 where a group has none."""
    result = np.full(num_groups, -1, dtype=np.int64)
    rows = np.arange(len(group), dtype=np.int64)
    if mask is not None:
        rows, group = rows[mask], group[mask]
    np.maximum.at(result, group, rows)
    return result


def first_index(group: np.ndarray, num_groups: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Index of the first row of each group (restricted to ``mask``), -1 where a group has none."""
    big = np.iinfo(np.int64).max
    result = np.full(num_groups, big, dtype=np.int64)
    rows = np.arange(len(group), dtype=np.int64)
    if mask is not None:
        rows, group = rows[mask], group[mask]
    np.minimum.at(result, group, rows)
    result[result == big] = -1
    return result


def take_or_null(column: pa.ChunkedArray | pa.Array, indices: np.ndarray) -> pa.Array:
    """``column[indices]`` with -1 meaning null."""
    idx = pa.array(indices, pa.int64(), mask=indices < 0)
    return pc.take(column, idx)


class RowMerger:
    """Base of the merge engines. Subclasses override :meth:`merge` and may refine checks."""

    name = "last_row"
    supports_partial_update = True

    def __init__(self, descriptor: TableDescriptor) -> None:
        self.descriptor = descriptor
        self.schema = descriptor.schema
        self.primary_key = descriptor.primary_key
        self.value_columns = tuple(n for n in self.schema.names if n not in self.primary_key)

    def check_write(self, kinds: np.ndarray, target_columns: tuple[str, ...] | None,
                    batch: pa.Table | None = None) -> None:
        """Refuse a write this engine cannot apply (raise InvalidInput before anything is written).

        ``batch`` is the whole write (every bucket), for engines whose refusals depend on values.
        """
        if target_columns is not None and not self.supports_partial_update:
            raise InvalidInput(f"table {self.descriptor.path}: the {self.name} merge engine does not "
                               "support partial updates")

    def merge(self, inp: MergeInput) -> MergeResult:
        raise NotImplementedError

    # ---- shared building blocks ---------------------------------------------------------------
    def _overlay(self, inp: MergeInput, source_rows: np.ndarray, null_targets: np.ndarray) -> pa.Table:
        """Rows built from ``old`` with the written columns taken from ``batch[source_rows]``.

        Key columns always come from the batch (they are equal for found groups); written columns
        come from the batch, or are null where ``null_targets`` (a partial delete); other columns
        keep the stored values.
        """
        written = set(inp.target_columns) if inp.target_columns is not None else set(self.schema.names)
        nulls_mask = pa.array(null_targets)
        untouched = source_rows < 0
        columns = []
        for field in self.schema:
            if field.name in self.primary_key:
                columns.append(take_or_null(inp.batch.column(field.name), source_rows))
            elif field.name in written:
                taken = take_or_null(inp.batch.column(field.name), source_rows)
                if null_targets.any():
                    taken = pc.if_else(nulls_mask, pa.nulls(len(taken), field.type), taken)
                columns.append(taken)
            else:
                columns.append(inp.old.column(field.name))
        if untouched.any():  # groups this batch does not change keep their stored row
            keep = pa.array(untouched)
            columns = [pc.if_else(keep, inp.old.column(i), column) for i, column in enumerate(columns)]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _any_value_present(self, table: pa.Table) -> np.ndarray:
        present = np.zeros(table.num_rows, dtype=bool)
        for name in self.value_columns:
            present |= table.column(name).is_valid().to_numpy(zero_copy_only=False)
        return present
