"""Plan nodes: immutable values the planner returns and the executor runs.

Every node renders itself as one deterministic line with :meth:`PlanNode.explain` (used by
``EXPLAIN`` and the golden plan files): ``Name(field=value, ...)`` in field order, where tables
render as ``db.table``, column tuples as ``[a, b]``, Arrow tables as lists of row tuples, filters
as SQL-like text and nested plans by their own ``explain()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pyarrow as pa

from flightstore.acl import Operation, Resource
from flightstore.expressions import AlwaysTrue, And, Comparison, In, IsNotNull, IsNull, Not, Or, Predicate, StartsWith
from flightstore.kv.ranges import KeyRange
from flightstore.schema import TableDescriptor, TablePath
from flightstore.sql.literals import render_value

__all__ = [
    "PlanNode", "Plan", "PointLookup", "PrefixLookup", "Scan", "RangeScan", "UnionScan", "LakeScan", "Count",
    "Changelog", "Residual", "ResidualInput", "Insert", "InsertSelect", "Delete", "Update", "CreateDatabase",
    "DropDatabase",
    "CreateTable", "DropTable", "ShowDatabases", "ShowTables", "Describe", "Explain", "UseDatabase",
    "Grant", "Revoke", "ShowGrants", "AlterTable", "ShowPartitions", "render_predicate", "render_change",
]

# A field that EXPLAIN shows only when set: e.g. the pruned partitions of a partitioned table.
_SHOWN_WHEN_SET = {"shown": "when set"}


def render_change(change: Any) -> str:
    """One ALTER TABLE change as SQL-like text."""
    from flightstore import alter
    from flightstore.schema import arrow_type_to_sql

    if isinstance(change, alter.AddColumns):
        return "ADD (" + ", ".join(f"{f.name} {arrow_type_to_sql(f.type)}" for f in change.fields) + ")"
    if isinstance(change, alter.ModifyColumn):
        return f"MODIFY {change.name} {arrow_type_to_sql(change.type)}"
    if isinstance(change, alter.SetOptions):
        return "SET (" + ", ".join(f"{k}={v}" for k, v in change.options) + ")"
    if isinstance(change, alter.ResetOptions):
        return "RESET (" + ", ".join(change.keys) + ")"
    if isinstance(change, alter.RenameTable):
        return f"RENAME TO {change.target}"
    if isinstance(change, alter.AddPartition):
        return f"ADD{' IF NOT EXISTS' if change.if_not_exists else ''} PARTITION {'$'.join(change.values)}"
    if isinstance(change, alter.DropPartition):
        return f"DROP{' IF EXISTS' if change.if_exists else ''} PARTITION {'$'.join(change.values)}"
    return repr(change)


def render_predicate(predicate: Predicate | None) -> str:
    """SQL-like text of a filter; ``None`` renders as ``None``."""
    if predicate is None:
        return "None"
    if isinstance(predicate, Comparison):
        return f"{predicate.column} {predicate.op} {render_value(predicate.value)}"
    if isinstance(predicate, In):
        return f"{predicate.column} IN {render_value(tuple(predicate.values))}"
    if isinstance(predicate, IsNull):
        return f"{predicate.column} IS NULL"
    if isinstance(predicate, IsNotNull):
        return f"{predicate.column} IS NOT NULL"
    if isinstance(predicate, StartsWith):
        return f"STARTS_WITH({predicate.column}, {render_value(predicate.prefix)})"
    if isinstance(predicate, And):
        return f"({render_predicate(predicate.left)} AND {render_predicate(predicate.right)})"
    if isinstance(predicate, Or):
        return f"({render_predicate(predicate.left)} OR {render_predicate(predicate.right)})"
    if isinstance(predicate, Not):
        return f"NOT {render_predicate(predicate.child)}"
    if isinstance(predicate, AlwaysTrue):
        return "TRUE"
    return repr(predicate)


def _render(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, PlanNode):
        return value.explain()
    if isinstance(value, Predicate):
        return render_predicate(value)
    if isinstance(value, (TablePath, Resource)):
        return str(value)
    if isinstance(value, Operation):
        return value.value
    if isinstance(value, TableDescriptor):
        return _render_descriptor(value)
    if isinstance(value, KeyRange):
        return value.describe(render_value)
    if isinstance(value, pa.Table):
        rows = zip(*(column.to_pylist() for column in value.columns)) if value.num_columns else []
        return "[" + ", ".join(_render_row(row) for row in rows) + "]"
    if isinstance(value, tuple):
        return "[" + ", ".join(_render(v) if not isinstance(v, str) else v for v in value) + "]"
    if type(value).__module__ == "flightstore.alter":
        return render_change(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value
    return render_value(value)


def _render_row(row: tuple) -> str:
    inner = ", ".join(render_value(v) for v in row)
    return f"({inner},)" if len(row) == 1 else f"({inner})"


def _render_descriptor(d: TableDescriptor) -> str:
    from flightstore.schema import arrow_type_to_sql

    cols = ", ".join(f"{f.name} {arrow_type_to_sql(f.type)}{'' if f.nullable else ' NOT NULL'}"
                     for f in d.schema)
    options = ", ".join(f"{k}={v}" for k, v in sorted(d.options.items()))
    return (f"{d.path}({cols}) primary_key={_render(d.primary_key)} "
            f"bucket_key={_render(d.bucket_key)} partition_keys={_render(d.partition_keys)} "
            f"buckets={d.num_buckets} options={{{options}}} comment={render_value(d.comment)}")


class PlanNode:
    """Base of every plan node."""

    def explain(self) -> str:
        """One deterministic line describing this node."""
        parts = []
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("shown") == "when set":
                continue
            text = render_value(value) if f.name in ("sql", "partial") else _render(value)
            parts.append(f"{f.name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"


Plan = PlanNode


# ---- queries ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=True)
class PointLookup(PlanNode):
    """Multi-get of whole primary keys; ``keys`` holds the PK columns cast to their types."""

    table: TablePath
    keys: pa.Table
    columns: tuple[str, ...]
    filter: Predicate | None = None


@dataclass(frozen=True)
class PrefixLookup(PlanNode):
    """Rows whose bucket-key columns equal a row of ``prefix`` (the bucket key leads the PK)."""

    table: TablePath
    prefix: pa.Table
    columns: tuple[str, ...]
    filter: Predicate | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Scan(PlanNode):
    """Column-pruned scan with an optional filter and row limit."""

    table: TablePath
    columns: tuple[str, ...]
    filter: Predicate | None = None
    limit: int | None = None
    partitions: tuple[str, ...] | None = field(default=None, metadata=_SHOWN_WHEN_SET)


@dataclass(frozen=True)
class RangeScan(PlanNode):
    """A scan of one primary-key range: a RocksDB seek range in every bucket, or in ``bucket``
    alone when equalities pin the whole bucket key. ``filter`` holds the part of the WHERE the
    range does not decide exactly (other columns, bounds on floating-point keys: a NaN key sorts
    inside a lower-bounded range), applied to every row read."""

    table: TablePath
    columns: tuple[str, ...]
    range: KeyRange
    bucket: int | None = None
    filter: Predicate | None = None
    limit: int | None = None
    partitions: tuple[str, ...] | None = field(default=None, metadata=_SHOWN_WHEN_SET)

    def explain(self) -> str:
        buckets = "all" if self.bucket is None else f"[{self.bucket}]"
        shown = "" if self.partitions is None else f", partitions={_render(self.partitions)}"
        return (f"RangeScan(table={self.table}, columns={_render(self.columns)}, "
                f"range={_render(self.range)}, buckets={buckets}, filter={_render(self.filter)}, "
                f"limit={_render(self.limit)}{shown})")


@dataclass(frozen=True)
class UnionScan(PlanNode):
    """A datalake-enabled log table read as one: its lake (one Iceberg snapshot: every row of each
    bucket below the tiered offset that snapshot records) plus each bucket's log from that offset
    on. ``columns`` and ``filter`` apply to both parts (Iceberg partition and statistics pruning
    and a row filter; the log's batch statistics)."""

    table: TablePath
    columns: tuple[str, ...]
    filter: Predicate | None = None
    limit: int | None = None

    def explain(self) -> str:
        columns, filter = _render(self.columns), _render(self.filter)
        return (f"UnionScan(table={self.table}, columns={columns}, filter={filter}, "
                f"limit={_render(self.limit)}, "
                f"lake=IcebergScan(snapshot=current, rows=below tiered offsets, columns={columns}, "
                f"row_filter={filter}), "
                f"log=LogScan(from=tiered offsets, columns={columns}, filter={filter}))")


@dataclass(frozen=True)
class LakeScan(PlanNode):
    """``t$lake``: the table's lake alone (its columns plus ``__bucket``, ``__offset``,
    ``__timestamp``), as of ``snapshot_id`` or wall-clock ``as_of_ms`` (``FOR SYSTEM_TIME AS
    OF``), else the latest commit; pruned and filtered by pyiceberg."""

    table: TablePath
    columns: tuple[str, ...]
    filter: Predicate | None = None
    limit: int | None = None
    snapshot_id: int | None = field(default=None, metadata=_SHOWN_WHEN_SET)
    as_of_ms: int | None = field(default=None, metadata=_SHOWN_WHEN_SET)


@dataclass(frozen=True)
class Count(PlanNode):
    """``SELECT COUNT(*) FROM t [WHERE <partition columns only>]``: one row, one BIGINT column
    named ``column_name``; ``partitions`` (a partitioned table) are the ones counted."""

    table: TablePath
    column_name: str
    partitions: tuple[str, ...] | None = field(default=None, metadata=_SHOWN_WHEN_SET)


@dataclass(frozen=True)
class Changelog(PlanNode):
    """The table's log with its change-type, offset and commit-timestamp columns."""

    table: TablePath
    kind: Literal["changelog", "binlog"]
    columns: tuple[str, ...]
    filter: Predicate | None = None
    limit: int | None = None
    partitions: tuple[str, ...] | None = field(default=None, metadata=_SHOWN_WHEN_SET)


@dataclass(frozen=True)
class ResidualInput(PlanNode):
    """One table feeding a residual query, registered under ``name`` (pruned and pre-filtered).

    With ``partial`` (see :mod:`flightstore.sql.partial`) the input is not the rows but the union
    of ``partial`` (DuckDB SQL over the rows, registered under ``name``) run on each bucket's rows
    where they are: partial aggregates that the residual SQL merges."""

    name: str
    table: TablePath
    source: Literal["table", "changelog", "binlog", "partitions", "lake", "lake_snapshots",
                    "lake_status"]
    columns: tuple[str, ...]
    filter: Predicate | None = None
    partitions: tuple[str, ...] | None = field(default=None, metadata=_SHOWN_WHEN_SET)
    snapshot_id: int | None = field(default=None, metadata=_SHOWN_WHEN_SET)
    as_of_ms: int | None = field(default=None, metadata=_SHOWN_WHEN_SET)
    partial: str | None = field(default=None, metadata=_SHOWN_WHEN_SET)


@dataclass(frozen=True)
class Residual(PlanNode):
    """DuckDB SQL over named inputs; the filters of the inputs are also still in ``sql``."""

    sql: str
    inputs: tuple[ResidualInput, ...] = ()


# ---- writes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Insert(PlanNode):
    """Rows to write; ``columns`` None means every column, else a partial update of those."""

    table: TablePath
    data: pa.Table
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class InsertSelect(PlanNode):
    """Write the result of ``query`` (its columns in order) into ``columns`` (None = all)."""

    table: TablePath
    query: PlanNode
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Delete(PlanNode):
    """Delete the rows with ``keys`` (then matching ``filter``), or matching ``filter``.

    Both None deletes every row.
    """

    table: TablePath
    keys: pa.Table | None = None
    filter: Predicate | None = None


@dataclass(frozen=True)
class Update(PlanNode):
    """Set ``assignments`` (column -> value cast to the column type) on the selected rows."""

    table: TablePath
    assignments: dict[str, Any] = field(default_factory=dict)
    keys: pa.Table | None = None
    filter: Predicate | None = None


# ---- DDL and metadata ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CreateDatabase(PlanNode):
    name: str
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropDatabase(PlanNode):
    name: str
    if_exists: bool = False
    cascade: bool = False


@dataclass(frozen=True)
class CreateTable(PlanNode):
    descriptor: TableDescriptor
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropTable(PlanNode):
    table: TablePath
    if_exists: bool = False


@dataclass(frozen=True)
class ShowDatabases(PlanNode):
    pass


@dataclass(frozen=True)
class ShowTables(PlanNode):
    database: str


@dataclass(frozen=True)
class Describe(PlanNode):
    table: TablePath


@dataclass(frozen=True)
class Explain(PlanNode):
    plan: PlanNode


@dataclass(frozen=True)
class UseDatabase(PlanNode):
    name: str


@dataclass(frozen=True)
class AlterTable(PlanNode):
    """ALTER TABLE: ``changes`` (of :mod:`flightstore.alter`) applied all or nothing."""

    table: TablePath
    changes: tuple = ()
    if_exists: bool = False


@dataclass(frozen=True)
class ShowPartitions(PlanNode):
    """``SHOW PARTITIONS t``: one ``partition`` row per partition, ``k=v[/k2=v2]``."""

    table: TablePath


# ---- access control -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant(PlanNode):
    """``GRANT operations ON resource TO principals`` (run by the server's authorizer)."""

    principals: tuple[str, ...]
    operations: tuple[Operation, ...]
    resource: Resource


@dataclass(frozen=True)
class Revoke(PlanNode):
    """``REVOKE operations ON resource FROM principals``."""

    principals: tuple[str, ...]
    operations: tuple[Operation, ...]
    resource: Resource


@dataclass(frozen=True)
class ShowGrants(PlanNode):
    """``SHOW GRANTS [FOR principal] [ON resource]``: the grants the caller may describe."""

    principal: str | None = None
    resource: Resource | None = None
