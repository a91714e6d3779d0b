"""How much memory a read may hold: every path cuts its batches by bytes, not only by rows.

``query.memory-limit`` bounds the embedded SQL engine (DuckDB), and the same figure bounds every
other read path of the server: a row count alone says nothing of a batch's size (65,536 rows of
10,000 BIGINT columns are 5 GB). So each path that builds batches sizes them from the rows'
width:

* :func:`batch_bytes`: the most a batch a read builds may hold (a RocksDB chunk, a KV image
  batch, a lake scanner's batch, an engine result batch): a 16th of the limit, between 1 MiB and
  16 MiB (smaller batches of a wide table cost more per column than they save). A read holds a
  few of them at once (read-ahead, the batch being sent);
* :func:`work_bytes`: the most one step of a query may hold in memory at once (a changelog tail
  folded in memory, a result kept for a client): a quarter of the limit. A step that would need
  more takes a bounded path instead (RocksDB in chunks) or is refused with
  :class:`~flightstore.errors.ResourceExhausted` before it holds anything (:func:`require`).

The server sets the limit when it starts (:func:`configure`); an embedded :class:`~flightstore.store.Store`
uses the option's default.
"""

from __future__ import annotations

from collections.abc import Sized

import pyarrow as pa

from flightstore.config import server_option
from flightstore.errors import ResourceExhausted

__all__ = ["batch_bytes", "batch_rows", "configure", "limit", "require", "row_width", "rows_within", "value_bytes",
           "work_bytes"]

_MIN_BATCH, _MAX_BATCH = 1 << 20, 16 << 20
_limit = int(server_option({}, "query.memory-limit"))


def configure(memory_limit: int) -> None:
    """Set the limit every read path sizes its batches by (the server's ``query.memory-limit``)."""
    global _limit
    _limit = max(1, int(memory_limit))


def limit() -> int:
    """``query.memory-limit`` in bytes."""
    return _limit


def batch_bytes() -> int:
    """The most one batch a read builds may hold."""
    return min(_MAX_BATCH, max(_MIN_BATCH, _limit // 16))


def work_bytes() -> int:
    """The most one step of a query may hold in memory at once."""
    return max(1, _limit // 4)


def rows_within(row_bytes: float, most: int, budget: int | None = None) -> int:
    """How many rows of ``row_bytes`` each fit in ``budget`` (default :func:`batch_bytes`):
    at least 1, at most ``most``."""
    budget = batch_bytes() if budget is None else budget
    return int(max(1, min(most, budget // max(1.0, float(row_bytes)))))


def batch_rows(schema: pa.Schema, most: int = 65_536) -> int:
    """Rows per batch for rows of ``schema`` (fixed widths, 32 bytes for a variable-width value)."""
    return rows_within(row_width(schema), most)


def row_width(schema: pa.Schema) -> int:
    """Estimated bytes of one row of ``schema``: fixed widths, 32 for each variable-width value."""
    width = 0
    for field in schema:
        try:
            width += max(field.type.bit_width // 8, 1)
        except ValueError:
            width += 32
    return max(1, width)


def value_bytes(values: Sized) -> int:
    """Bytes of a list of encoded values (``bytes``)."""
    return sum(map(len, values))  # type: ignore[arg-type]


def require(estimate: int, what: str) -> None:
    """Refuse (:class:`ResourceExhausted`) a step estimated at ``estimate`` bytes when that passes
    :func:`work_bytes`."""
    if estimate > work_bytes():
        raise ResourceExhausted(f"{what} needs about {estimate:,} bytes of memory, more than a query may hold "
                                f"(a quarter of query.memory-limit, {limit():,} bytes); read fewer rows or "
                                "columns at once")
