"""Rows grouped by key with Arrow and numpy, for the writer's fold and the pipelines' folds and
matches: no Acero (``Table.group_by`` / ``join`` import ``pyarrow.dataset`` and with it pandas,
seconds of CPU in every fresh Spark Python worker) and no ``np.unique(axis=0)`` (a sort of
structured rows, the slowest part of a delta join task), and no pandas (numpy through the
buffers: :mod:`flightstore_spark.arrays`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore_spark.arrays import from_numpy, to_numpy

__all__ = ["key_groups"]


def key_groups(table: pa.Table, key: Sequence[str]) -> np.ndarray:
    """A group number per row of ``table``, equal for rows with equal ``key`` (nulls equal to
    each other), dense from 0. One key column: numbered by first occurrence; more: each further
    column is paired with the groups so far and renumbered (hashed, by first occurrence), so
    numbers stay below the row count."""
    group = np.zeros(table.num_rows, dtype=np.int64)
    for name in key:
        encoded = pc.dictionary_encode(table.column(name).combine_chunks(), null_encoding="encode")
        codes = to_numpy(encoded.indices).astype(np.int64)  # nulls are encoded: no null index
        if name == key[0]:
            group = codes
        else:
            paired = from_numpy(group * len(encoded.dictionary) + codes)
            group = to_numpy(pc.dictionary_encode(paired).indices).astype(np.int64)
    return group
