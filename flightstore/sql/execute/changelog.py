"""``t$changelog`` and ``t$binlog`` reads: the logs with change type, offset and commit time.

A plain changelog read (no filter) streams each bucket's log, cut to the limit; anything else reads
the changelog whole and filters it. The binlog pairs each ``-U`` with its ``+U``: one row per
change with ``before`` and ``after`` images.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.schema import TablePath
from flightstore.sql import nodes as n
from flightstore.sql.resolve import binlog_schema, changelog_schema
from flightstore.store import Store, Table

__all__ = ["changelog_batches", "changelog_table"]


def changelog_table(store: Store, path: TablePath, kind: str, partition: int | None = None,
                    partitions: tuple[str, ...] | None = None) -> pa.Table:
    """The whole changelog (``kind`` "changelog") or binlog ("binlog") of ``path``: of one bucket
    when ``partition`` is given, else of the buckets of ``partitions`` (default: all)."""
    table = store.table(path)
    buckets = table.bucket_ids(partitions) if partition is None else [partition]
    schema = changelog_schema(table.descriptor)
    batches = [b for bucket in buckets for b in table.read_changelog(bucket)]
    full = pa.Table.from_batches(batches, schema=schema)
    return _binlog(full, table) if kind == "binlog" else full


def changelog_batches(store: Store, plan: n.Changelog, partition: int | None) -> Iterator[pa.Table]:
    """The rows of a ``Changelog`` plan (of one bucket when ``partition`` is given)."""
    table = store.table(plan.table)
    if plan.kind == "changelog" and plan.filter is None:
        remaining = plan.limit
        buckets = table.bucket_ids(plan.partitions) if partition is None else [partition]
        for bucket in buckets:
            for batch in table.read_changelog(bucket, columns=list(plan.columns), max_rows=remaining):
                if remaining is not None:
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                yield batch
                if remaining is not None and remaining <= 0:
                    return
        return
    full = changelog_table(store, plan.table, plan.kind, partition, plan.partitions)
    if plan.filter is not None:
        full = full.filter(plan.filter.bind(full.schema).to_arrow())
    if plan.limit is not None:
        full = full.slice(0, plan.limit)
    yield full.select(list(plan.columns))


def _binlog(changelog: pa.Table, table: Table) -> pa.Table:
    """Pair each -U with its +U: one row per change with ``before`` and ``after`` images."""
    kinds = changelog.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
    rows = changelog.select(table.schema.names)
    row_type = pa.struct(list(table.schema))
    images = pa.StructArray.from_arrays([c.combine_chunks() for c in rows.columns], fields=list(table.schema)) \
        if rows.num_rows else pa.array([], row_type)
    n_rows = len(kinds)
    idx = np.arange(n_rows)
    before_row = np.full(n_rows, -1)
    after_row = np.full(n_rows, -1)
    keep = np.zeros(n_rows, dtype=bool)
    inserts = kinds == "+I"
    deletes = kinds == "-D"
    updates = kinds == "+U"
    after_row[inserts | updates] = idx[inserts | updates]
    before_row[deletes] = idx[deletes]
    ub = np.flatnonzero(updates)
    has_before = (ub > 0) & (kinds[np.maximum(ub - 1, 0)] == "-U")
    before_row[ub[has_before]] = ub[has_before] - 1
    keep[inserts | deletes | updates] = True
    labels = np.where(inserts, "insert", np.where(deletes, "delete", "update"))

    def pick(positions: np.ndarray) -> pa.Array:
        chosen = positions[keep]
        return pc.take(images, pa.array(chosen, pa.int64(), mask=chosen < 0))

    mask = pa.array(keep)
    return pa.table({
        changetype.CHANGE_TYPE_COLUMN: pa.array(labels[keep], pa.string()),
        changetype.LOG_OFFSET_COLUMN: changelog.column(changetype.LOG_OFFSET_COLUMN).filter(mask),
        changetype.COMMIT_TIMESTAMP_COLUMN: changelog.column(changetype.COMMIT_TIMESTAMP_COLUMN).filter(mask),
        "before": pick(before_row), "after": pick(after_row),
    }, schema=binlog_schema(table.descriptor))
