"""Names in SQL -> catalog objects: databases, tables (and their ``$changelog`` / ``$binlog``
views) and columns, matched case-insensitively when unambiguous.

The planner only sees the catalog through :class:`CatalogView`; nothing here does I/O of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa
from sqlglot import exp

from flightstore import changetype
from flightstore.errors import DatabaseNotFound, SqlError, TableNotFound
from flightstore.schema import TableDescriptor, TablePath

__all__ = [
    "CatalogView", "ResolvedTable", "resolve_database", "resolve_table", "resolve_table_node",
    "resolve_column", "changelog_schema", "binlog_schema", "partitions_schema", "META_COLUMNS",
    "VIEWS",
]

VIEWS = ("changelog", "binlog", "partitions")  # the ``t$<view>`` system tables


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


@dataclass(frozen=True)
class ResolvedTable:
    """A table reference: the descriptor, which view of it (``table``/``changelog``/``binlog``)
    and the schema of that view."""

    descriptor: TableDescriptor
    source: str
    schema: pa.Schema

    @property
    def path(self) -> TablePath:
        return self.descriptor.path


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
        base, _, suffix = name.rpartition("$")
        if suffix.lower() not in VIEWS:
            raise TableNotFound(f"table {name!r} does not exist; system tables are "
                                "<table>$changelog, <table>$binlog and <table>$partitions")
        name, source = base, suffix.lower()
    descriptor = resolve_table(catalog, node.db or None, name)
    if source == "table":
        return ResolvedTable(descriptor, source, descriptor.schema)
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
