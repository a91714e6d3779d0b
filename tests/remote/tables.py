"""Tables of the remote storage tests (no fixtures: the crash test's child imports this)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

EVENTS = pa.schema([("seq", pa.int64()), ("s", pa.string())])
ROWS = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
# Small segments: about every write closes one, so a handful of writes makes several to upload.
TIERED = {"table.log.segment.bytes": "1024", "table.log.tiered.local-segments": "1"}


def events(first: int, count: int) -> pa.Table:
    """Rows with ``seq`` first..first+count-1."""
    seq = np.arange(first, first + count, dtype=np.int64)
    return pa.table({"seq": seq, "s": pa.array([f"v{i}" for i in seq])}, schema=EVENTS)


def rows(keys, values) -> pa.Table:
    """Primary-key rows ``k``, ``v``."""
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values, pa.int64())}, schema=ROWS)
