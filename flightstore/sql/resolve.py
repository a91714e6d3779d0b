"""Names in SQL -> catalog objects: databases, tables (and their ``$changelog`` / ``$binlog`` /
``$partitions`` / ``$lake`` / ``$lake$snapshots`` / ``$lake$status`` views, ``$lake`` with its
``FOR SYSTEM_TIME AS OF`` time travel) and columns, matched case-insensitively when unambiguous.

The planner only sees the catalog through :class:`CatalogView`; nothing here does I/O of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable

import pyarrow as pa
from sqlglot import exp

from flightstore import changetype
from flightstore.errors import DatabaseNotFound, SqlError, TableNotFound
from flightstore.lake.layout import table_types
from flightstore.schema import TableDescriptor, TablePath

__all__ = [
    "CatalogView", "ResolvedTable", "VisibleCatalog", "resolve_database", "resolve_table", "resolve_table_node",
    "resolve_column", "changelog_schema", "binlog_schema", "partitions_schema", "lake_schema",
    "lake_snapshots_schema", "lake_status_schema", "META_COLUMNS", "VIEWS",
]

# The ``t$<view>`` system tables: suffix -> source name.
VIEWS = {"changelog": "changelog", "binlog": "binlog", "partitions": "partitions", "lake": "lake",
         "lake$snapshots": "lake_snapshots", "lake$status": "lake_status"}
LAKE_SOURCES = ("lake", "lake_snapshots", "lake_status")


@runtime_checkable
class CatalogView(Protocol):
    """What the planner needs from the catalog.

    A view may also offer ``list_tables(database) -> list[str]``; then table names match
    case-insensitively, otherwise the exact and the lower-cased spelling are tried.
    """

    default_database: str

    def get_table(self, path: TablePath) -> TableDescriptor:
        """The table's descriptor; raises :class:`~flightstore.errors.TableNotFound`."""
        ...

    def list_databases(self) -> list[str]:
        ...


class VisibleCatalog:
    """``catalog`` as one caller sees it: the databases and tables it may not see are absent.

    ``sees_database(name)`` / ``sees_table(path)`` say what the caller sees. A statement naming a
    hidden object then fails exactly as if the object did not exist (same error, same message)
    and learns nothing of it: not its columns, types, options or existence.
    """

    def __init__(self, catalog: CatalogView, sees_database: Callable[[str], bool],
                 sees_table: Callable[[TablePath], bool]) -> None:
        self.catalog = catalog
        self.default_database = catalog.default_database
        self.sees_database = sees_database
        self.sees_table = sees_table

    def get_table(self, path: TablePath) -> TableDescriptor:
        if not (self.sees_database(path.database) and self.sees_table(path)):
            raise TableNotFound(f"table {path} does not exist")
        return self.catalog.get_table(path)

    def list_databases(self) -> list[str]:
        return [name for name in self.catalog.list_databases() if self.sees_database(name)]

    def list_tables(self, database: str) -> list[str]:
        lister = getattr(self.catalog, "list_tables", None)
        if lister is None:
            raise TypeError("a VisibleCatalog needs a catalog view that lists tables")
        return [name for name in lister(database) if self.sees_table(TablePath(database, name))]


META_COLUMNS = changetype.META_FIELDS


def changelog_schema(descriptor: TableDescriptor) -> pa.Schema:
    """``t$changelog``: the table's columns, then ``_change_type``, ``_log_offset``,
    ``_commit_timestamp``."""
    return changetype.changelog_schema(descriptor.schema)


def binlog_schema(descriptor: TableDescriptor) -> pa.Schema:
    """``t$binlog`` (primary-key tables): one row per change with ``before`` / ``after`` images."""
    row = pa.struct(list(descriptor.schema))
    return pa.schema(list(META_COLUMNS) + [pa.field("before", row), pa.field("after", row)])


def partitions_schema(descriptor: TableDescriptor) -> pa.Schema:
    """``t$partitions`` (partitioned tables): one row per partition with its name, id, values
    (typed as the partition columns), bucket count and maintained row count."""
    keys = [descriptor.schema.field(k).with_nullable(False) for k in descriptor.partition_keys]
    return pa.schema([pa.field("partition_name", pa.string(), nullable=False),
                      pa.field("partition_id", pa.int64(), nullable=False), *keys,
                      pa.field("num_buckets", pa.int32(), nullable=False),
                      pa.field("row_count", pa.int64(), nullable=False)])


def lake_schema(descriptor: TableDescriptor) -> pa.Schema:
    """``t$lake``: the table's columns, then ``__bucket``, ``__offset``, ``__timestamp``."""
    return table_types(descriptor)


def lake_snapshots_schema() -> pa.Schema:
    """``t$lake$snapshots``: one row per tiering commit, oldest first; ``offsets`` maps each
    bucket to the log offset below which the lake holds its rows after the commit."""
    return pa.schema([pa.field("snapshot_id", pa.int64(), nullable=False),
                      pa.field("committed_at", pa.timestamp("ms", tz="UTC"), nullable=False),
                      pa.field("added_rows", pa.int64(), nullable=False),
                      pa.field("total_rows", pa.int64(), nullable=False),
                      pa.field("offsets", pa.map_(pa.int32(), pa.int64()), nullable=False)])


def lake_status_schema() -> pa.Schema:
    """``t$lake$status``: one row per bucket: the tiered offset (null: not known yet), the log end
    offset, the lag in records and seconds, then the table's last commit, last error and tierer,
    and what the lake upkeep last did (when, snapshots expired, files deleted, its error), and the
    bucket's lake files reads found damaged (missing, truncated, corrupt)."""
    return pa.schema([pa.field("bucket", pa.int32(), nullable=False),
                      pa.field("tiered_offset", pa.int64()),
                      pa.field("log_end_offset", pa.int64(), nullable=False),
                      pa.field("lag_records", pa.int64(), nullable=False),
                      pa.field("lag_seconds", pa.float64(), nullable=False),
                      pa.field("last_commit", pa.timestamp("ms", tz="UTC")),
                      pa.field("last_snapshot_id", pa.int64()),
                      pa.field("last_error", pa.string()),
                      pa.field("consecutive_failures", pa.int64(), nullable=False),
                      pa.field("tierer", pa.string()),
                      pa.field("last_upkeep", pa.timestamp("ms", tz="UTC")),
                      pa.field("upkeep_expired_snapshots", pa.int64(), nullable=False),
                      pa.field("upkeep_removed_files", pa.int64(), nullable=False),
                      pa.field("upkeep_error", pa.string()),
                      pa.field("damaged_files", pa.list_(pa.string()), nullable=False)])


@dataclass(frozen=True)
class ResolvedTable:
    """A table reference: the descriptor, which view of it (``table``/``changelog``/``binlog``/
    ``partitions``/``lake``/``lake_snapshots``/``lake_status``) and the schema of that view;
    ``snapshot_id`` / ``as_of_ms`` when a ``$lake`` reference travels in time."""

    descriptor: TableDescriptor
    source: str
    schema: pa.Schema
    snapshot_id: int | None = None
    as_of_ms: int | None = None

    @property
    def path(self) -> TablePath:
        return self.descriptor.path

    @property
    def shown(self) -> str:
        """How SQL names this reference: ``db.t`` or ``db.t$<view>``."""
        if self.source == "table":
            return str(self.path)
        return f"{self.path}${next(k for k, v in VIEWS.items() if v == self.source)}"


def resolve_database(catalog: CatalogView, name: str) -> str:
    """The catalog's spelling of database ``name``; DatabaseNotFound when there is none."""
    databases = list(catalog.list_databases())
    if name in databases:
        return name
    matches = [d for d in databases if d.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SqlError(f"database name {name!r} is ambiguous: {', '.join(sorted(matches))}; quote it")
    raise DatabaseNotFound(f"database {name!r} does not exist")


def resolve_table(catalog: CatalogView, database: str | None, name: str) -> TableDescriptor:
    """The descriptor of ``database.name`` (default database when None), case-insensitively."""
    shown = f"{database}.{name}" if database else name
    try:
        db = resolve_database(catalog, database or catalog.default_database)
    except DatabaseNotFound:
        raise TableNotFound(f"table {shown!r} does not exist (no database "
                            f"{database or catalog.default_database!r})") from None
    candidates = [name]
    lister = getattr(catalog, "list_tables", None)
    if lister is not None:
        tables = list(lister(db))
        if name not in tables:
            candidates = [t for t in tables if t.lower() == name.lower()]
            if len(candidates) > 1:
                raise SqlError(f"table name {shown!r} is ambiguous: {', '.join(sorted(candidates))}")
    elif name.lower() != name:
        candidates.append(name.lower())
    for candidate in candidates:
        try:
            return catalog.get_table(TablePath(db, candidate))
        except TableNotFound:
            continue
    raise TableNotFound(f"table {shown!r} does not exist")


def resolve_table_node(catalog: CatalogView, node: exp.Table) -> ResolvedTable:
    """Resolve a FROM/JOIN/INSERT table node, including ``t$changelog`` and ``t$binlog``."""
    if not isinstance(node.this, exp.Identifier):
        raise SqlError(f"unsupported table expression {node.sql()!r}; only catalog tables can be "
                       "queried")
    if node.args.get("catalog"):
        raise TableNotFound(f"table {node.sql()!r} does not exist; use database.table")
    name = node.name
    source = "table"
    if "$" in name:
        lowered = name.lower()
        suffix = next((s for s in ("lake$snapshots", "lake$status") if lowered.endswith("$" + s)),
                      lowered.rpartition("$")[2])
        if suffix not in VIEWS:
            raise TableNotFound(f"table {name!r} does not exist; system tables are "
                                "<table>$changelog, <table>$binlog, <table>$partitions, <table>$lake, "
                                "<table>$lake$snapshots and <table>$lake$status")
        name, source = name[: len(name) - len(suffix) - 1], VIEWS[suffix]
    version = node.args.get("version")
    if version is not None and source != "lake":
        raise SqlError(f"FOR SYSTEM_TIME AS OF reads the lake as it was: query {name}$lake, not "
                       f"{node.name}")
    descriptor = resolve_table(catalog, node.db or None, name)
    if source in LAKE_SOURCES and not descriptor.option("table.datalake.enabled"):
        raise SqlError(f"{descriptor.path}${suffix}: table {descriptor.path} is not datalake-enabled "
                       "('table.datalake.enabled')")
    if source == "table":
        return ResolvedTable(descriptor, source, descriptor.schema)
    if source == "lake":
        snapshot_id, as_of_ms = _as_of(version) if version is not None else (None, None)
        return ResolvedTable(descriptor, source, lake_schema(descriptor), snapshot_id, as_of_ms)
    if source == "lake_snapshots":
        return ResolvedTable(descriptor, source, lake_snapshots_schema())
    if source == "lake_status":
        return ResolvedTable(descriptor, source, lake_status_schema())
    if source == "changelog":
        return ResolvedTable(descriptor, source, changelog_schema(descriptor))
    if source == "partitions":
        if not descriptor.is_partitioned:
            raise SqlError(f"{descriptor.path}$partitions: table {descriptor.path} is not partitioned")
        return ResolvedTable(descriptor, source, partitions_schema(descriptor))
    if not descriptor.has_primary_key:
        raise SqlError(f"{descriptor.path}$binlog: binlog is only available for primary-key tables; "
                       f"use {descriptor.path.table}$changelog")
    return ResolvedTable(descriptor, source, binlog_schema(descriptor))


def _as_of(version: exp.Expression) -> tuple[int | None, int | None]:
    """``FOR SYSTEM_TIME AS OF <snapshot id>`` -> (id, None); ``... AS OF TIMESTAMP '...'`` (or a
    timestamp string; UTC unless it carries an offset) -> (None, epoch milliseconds)."""
    value = version.expression
    text = value.sql()
    if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal) and not value.this.is_string:
        raise SqlError(f"FOR SYSTEM_TIME AS OF {text}: a snapshot id is a non-negative integer")
    if isinstance(value, exp.Literal) and not value.is_string:
        try:
            return int(value.this), None
        except ValueError:
            raise SqlError(f"FOR SYSTEM_TIME AS OF {text}: a snapshot id is an integer") from None
    if isinstance(value, exp.Cast) and value.to.is_type(*exp.DataType.TEMPORAL_TYPES):
        value = value.this
    if not (isinstance(value, exp.Literal) and value.is_string):
        raise SqlError(f"FOR SYSTEM_TIME AS OF {text}: give a snapshot id or TIMESTAMP '...'")
    try:
        moment = datetime.fromisoformat(value.this.strip())
    except ValueError:
        raise SqlError(f"FOR SYSTEM_TIME AS OF: {value.this!r} is not a timestamp "
                       "(YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM])") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return None, (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def resolve_column(schema: pa.Schema, name: str, table: object) -> str:
    """The schema's spelling of column ``name``; SqlError naming the column and ``table``."""
    if name in schema.names:
        return name
    matches = [n for n in schema.names if n.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise SqlError(f"column name {name!r} is ambiguous in {table}: {', '.join(matches)}")
    raise SqlError(f"unknown column {name!r} in table {table}; columns are {', '.join(schema.names)}")
