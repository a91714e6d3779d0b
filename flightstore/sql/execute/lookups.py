"""The point-lookup fast path: ``PointLookup`` and ``PrefixLookup`` plans onto KV multi-gets and
prefix scans. A lookup answers whole (never streamed, bounded by the keys in the statement), in
the plan's column order; a residual filter (``WHERE pk = 1 AND v > 2``) reads its extra columns,
filters, and drops them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightstore.sql import nodes as n
from flightstore.store import Store, Table

__all__ = ["point_lookup", "prefix_lookup"]


def point_lookup(store: Store, plan: n.PointLookup) -> pa.Table:
    """The rows of ``plan.keys`` (in key order; missing keys answer no row)."""
    table = store.table(plan.table)
    if plan.filter is None:  # the common case on its own: one multi-get, nothing re-selected
        return table.lookup(plan.keys, plan.columns)
    found = table.lookup(plan.keys, _with_filter_columns(plan.columns, plan.filter))
    return _filtered(found, plan.filter, table).select(list(plan.columns))


def prefix_lookup(store: Store, plan: n.PrefixLookup) -> pa.Table:
    """The rows whose leading key columns equal a row of ``plan.prefix`` (at most ``plan.limit``)."""
    table = store.table(plan.table)
    limit = plan.limit if plan.filter is None else None
    found = table.prefix_lookup(plan.prefix, _with_filter_columns(plan.columns, plan.filter), limit)
    found = _filtered(found, plan.filter, table).select(list(plan.columns))
    return found if plan.limit is None else found.slice(0, plan.limit)


def _with_filter_columns(columns: Sequence[str], filter) -> list[str]:
    extra = sorted(filter.columns()) if filter is not None else []
    return list(columns) + [c for c in extra if c not in columns]


def _filtered(rows: pa.Table, filter, table: Table) -> pa.Table:
    if filter is None or rows.num_rows == 0:
        return rows
    return rows.filter(filter.bind(table.schema).to_arrow())
