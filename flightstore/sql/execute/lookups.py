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

__all__ = ["point_lookup", "point_row", "prefix_lookup"]


def point_lookup(store: Store, plan: n.PointLookup) -> pa.Table:
    """The rows of ``plan.keys`` (in key order; missing keys answer no row)."""
    table = store.table(plan.table)
    if plan.filter is None:  # the common case on its own: one multi-get, nothing re-selected
        return table.lookup(plan.keys, plan.columns)
    found = table.lookup(plan.keys, _with_filter_columns(plan.columns, plan.filter))
    return _filtered(found, plan.filter, table).select(list(plan.columns))


def point_row(store: Store, plan: n.PointLookup, values: Sequence[int]) -> tuple[pa.Table, int] | None:
    """:func:`point_lookup` of one key of integer columns given as Python ints (a template's,
    :meth:`~.plan_cache.PlanCache.point_key`), with the result's schema (``projection`` of the
    plan's columns): the stored value read by its bucket and RocksDB key and its row written as
    one IPC message (:mod:`flightstore.kv.row_message`) that becomes the table in one read, not a
    key table, a decoded row and casts; with the row's buffer bytes (the metrics' count of what is
    sent). None when the table is not one this route reads (a partitioned or cluster table, keys
    of other types) or the value is of an older schema version: the caller runs the plan."""
    table = store.table(plan.table)
    if table.distributed or table.descriptor.is_partitioned or plan.filter is not None:
        return None
    point = table.point(values)
    if point is None:
        return None
    kv = table.kvs[point[0]]
    value = kv.stored_value(point[1])
    schema = table.projection(plan.columns)
    if value is None:
        return schema.empty_table(), 0
    writer = kv.codec.row_message_of(value, plan.columns)
    if writer is None or not writer.fits(schema):
        return None
    message, nbytes = writer.message(value)
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(message), schema)]), nbytes


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
