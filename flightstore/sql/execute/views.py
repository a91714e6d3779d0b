"""The tables the catalog and the lake show as rows: ``t$partitions``, ``t$lake`` (time travel
included), ``t$lake$snapshots``, ``t$lake$status``, ``DESCRIBE``, ``SHOW PARTITIONS`` and what
``EXPLAIN`` of a union read adds (the lake snapshot and the log offsets it would read now).

Without a lake (an embedded store, a cluster started without a shared lake) the ``$lake`` views
are refused. In a cluster every server reads the cluster's one lake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from flightstore.errors import FlightstoreError, Unsupported
from flightstore.partitioning import flink_name, values_table
from flightstore.schema import TablePath, arrow_type_to_sql
from flightstore.sql import nodes as n
from flightstore.sql.execute.context import ExecutionContext
from flightstore.sql.resolve import lake_snapshots_schema, lake_status_schema, partitions_schema

__all__ = ["SystemViews"]


class SystemViews:
    """The rows of the catalog's and the lake's views, read from ``context`` at call time."""

    def __init__(self, context: ExecutionContext) -> None:
        self.context = context

    def lake_catalog(self, path: TablePath) -> Any:
        lake = self.context.lake
        if lake is None:
            raise Unsupported(f"{path}$lake: this server has no lake (an embedded store, or a cluster "
                              "member started without datalake.iceberg.uri and datalake.iceberg.warehouse)")
        return lake

    def union_parts(self, plan: n.UnionScan) -> list[str]:
        """What a union read would read now: the lake snapshot and the data files left after
        pruning, and where each bucket's log part starts (EXPLAIN's lines after the plan)."""
        from flightstore.lake.union import plan_split
        table = self.context.store.table(plan.table)
        try:
            planned = plan_split(self.context.lake, table, plan.filter)
        except FlightstoreError as exc:
            return [f"lake: cannot be planned now ({type(exc).__name__}: {exc})"]
        offsets = {int(b): o for b, o in planned["offsets"].items()}
        ends = table.end_offsets()
        files = planned["files"]
        lake = "lake: none (nothing tiered yet)" if planned["snapshot_id"] is None else \
            (f"lake: snapshot {planned['snapshot_id']}, {len(files)} data file(s) after pruning, "
             f"{sum(f['rows'] for f in files)} row(s) in them")
        log = "log: " + ", ".join(f"bucket {b} offsets [{offsets[b]}, {ends[b]})" for b in sorted(offsets))
        return [lake, log]

    def lake_rows(self, path: TablePath, columns: Sequence[str], filter, limit: int | None,
                  snapshot_id: int | None, as_of_ms: int | None, stream: bool = False):
        """``t$lake`` rows (time travel when ``snapshot_id`` / ``as_of_ms`` is set): a table, or
        with ``stream`` a ``(schema, batches)`` stream (bounded memory)."""
        from flightstore.lake.read import lake_batches, read_lake
        catalog = self.lake_catalog(path)
        descriptor = self.context.store.table(path).descriptor
        read = lake_batches if stream else read_lake
        return read(catalog, descriptor, columns=list(columns), filter=filter, limit=limit,
                    snapshot_id=snapshot_id, as_of_ms=as_of_ms)

    def lake_snapshots_table(self, path: TablePath) -> pa.Table:
        """``t$lake$snapshots``: one row per tiering commit, oldest first."""
        from flightstore.lake.read import lake_snapshots
        commits = lake_snapshots(self.lake_catalog(path), self.context.store.table(path).descriptor)
        return pa.table({
            "snapshot_id": [c.snapshot_id for c in commits],
            "committed_at": [c.timestamp_ms for c in commits],
            "added_rows": [c.added_rows for c in commits],
            "total_rows": [c.total_rows for c in commits],
            "offsets": [sorted(c.offsets.items()) for c in commits],
        }, schema=lake_snapshots_schema())

    def lake_status_table(self, path: TablePath) -> pa.Table:
        """``t$lake$status``: the tiering status of each bucket (the tierer's when this process
        tiers: it knows the last error; else what the lake's last commit says)."""
        from flightstore.lake.status import lake_status
        table = self.context.store.table(path)
        tierer = self.context.tierer
        status = tierer.status(path) if tierer is not None else \
            lake_status(self.lake_catalog(path), table)
        buckets = status.buckets
        n_rows = len(buckets)
        return pa.table({
            "bucket": [b.bucket for b in buckets],
            "tiered_offset": [b.tiered_offset for b in buckets],
            "log_end_offset": [b.log_end_offset for b in buckets],
            "lag_records": [b.lag_records for b in buckets],
            "lag_seconds": [b.lag_seconds for b in buckets],
            "last_commit": [status.last_commit_ms] * n_rows,
            "last_snapshot_id": [status.last_snapshot_id] * n_rows,
            "last_error": [status.last_error] * n_rows,
            "consecutive_failures": [status.consecutive_failures] * n_rows,
            "tierer": [status.tierer] * n_rows,
            "last_upkeep": [status.last_upkeep_ms] * n_rows,
            "upkeep_expired_snapshots": [status.upkeep_expired_snapshots] * n_rows,
            "upkeep_removed_files": [status.upkeep_removed_files] * n_rows,
            "upkeep_error": [status.upkeep_error] * n_rows,
            "damaged_files": [list(b.damaged_files) for b in buckets],
        }, schema=lake_status_schema())

    def partitions_table(self, path: TablePath) -> pa.Table:
        """``t$partitions``: every partition with its values, buckets and maintained row count."""
        table = self.context.store.table(path)
        descriptor = table.descriptor
        stats = table.partition_stats()
        partitions = [p for p, _ in stats]
        values = values_table(partitions, descriptor.partition_keys, descriptor.schema)
        columns = {"partition_name": [p.name for p in partitions],
                   "partition_id": [p.id for p in partitions],
                   **{k: values.column(k) for k in descriptor.partition_keys},
                   "num_buckets": [descriptor.num_buckets] * len(partitions),
                   "row_count": [count for _, count in stats]}
        return pa.table(columns, schema=partitions_schema(descriptor))

    def describe_table(self, path: TablePath) -> pa.Table:
        """``DESCRIBE t``: each column's name, SQL type, nullability, key and partition-key role."""
        descriptor = self.context.store.table(path).descriptor
        return pa.table({
            "name": [f.name for f in descriptor.schema],
            "type": [arrow_type_to_sql(f.type) for f in descriptor.schema],
            "null": [f.nullable for f in descriptor.schema],
            "key": [("PRI" if f.name in descriptor.primary_key else None) for f in descriptor.schema],
            "partition_key": [f.name in descriptor.partition_keys for f in descriptor.schema],
        })

    def show_partitions_table(self, path: TablePath) -> pa.Table:
        """``SHOW PARTITIONS t``: the partitions' Flink names, sorted by partition name."""
        descriptor = self.context.store.table(path).descriptor
        names = sorted(descriptor.partitions, key=lambda p: p.name)
        return pa.table({"partition": pa.array([flink_name(descriptor.partition_keys, p.values)
                                                for p in names], pa.string())})
