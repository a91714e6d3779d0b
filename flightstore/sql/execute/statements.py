"""Statements: DDL and writes run once and answer the number of rows they affected.

``INSERT ... SELECT`` runs its query through the executor (``execute_table``); ``DELETE`` and
``UPDATE`` select their rows by key (a multi-get) or by a filtered scan, then write by key.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from flightstore.alter import DropPartition
from flightstore.errors import DatabaseNotFound, SqlError, Unsupported
from flightstore.sql import nodes as n
from flightstore.sql.execute.context import ExecutionContext
from flightstore.store import Table

__all__ = ["Statements"]


class Statements:
    """Runs DDL and write plans against ``context``'s store; ``execute_table`` answers the query
    of an ``INSERT ... SELECT``."""

    def __init__(self, context: ExecutionContext,
                 execute_table: Callable[[n.PlanNode], pa.Table]) -> None:
        self.context = context
        self.execute_table = execute_table

    def run(self, plan: n.PlanNode) -> int:
        """Execute a DDL or write statement; return the number of rows it affected."""
        store = self.context.store
        if isinstance(plan, n.CreateDatabase):
            store.create_database(plan.name, plan.if_not_exists)
        elif isinstance(plan, n.DropDatabase):
            store.drop_database(plan.name, plan.if_exists, plan.cascade)
        elif isinstance(plan, n.CreateTable):
            store.create_table(plan.descriptor.path, descriptor=plan.descriptor,
                               if_not_exists=plan.if_not_exists)
        elif isinstance(plan, n.DropTable):
            store.drop_table(plan.table, plan.if_exists)
        elif isinstance(plan, n.AlterTable):
            if plan.changes:
                store.alter_table(plan.table, plan.changes)
                tierer = self.context.tierer
                if tierer is not None and any(isinstance(c, DropPartition) for c in plan.changes):
                    tierer.due_now(plan.table)  # the lake drops the partition's rows now
        elif isinstance(plan, n.UseDatabase):
            if not store.catalog.database_exists(plan.name):
                raise DatabaseNotFound(f"database {plan.name!r} does not exist")
        elif isinstance(plan, n.Insert):
            return _write(store.table(plan.table), plan.data, plan.columns)
        elif isinstance(plan, n.InsertSelect):
            result = self.execute_table(plan.query)
            table = store.table(plan.table)
            target = plan.columns or tuple(table.schema.names)
            if result.num_columns != len(target):
                raise SqlError(f"INSERT INTO {plan.table} names {len(target)} columns but the query "
                               f"returns {result.num_columns}")
            return _write(table, result.rename_columns(list(target)), plan.columns)
        elif isinstance(plan, n.Delete):
            return _delete(store.table(plan.table), plan)
        elif isinstance(plan, n.Update):
            return _update(store.table(plan.table), plan)
        elif isinstance(plan, n.Explain):
            return 0
        elif isinstance(plan, (n.Grant, n.Revoke)):
            raise Unsupported("GRANT and REVOKE are kept by a server's authorizer; the embedded "
                              "store has no users")
        else:
            raise Unsupported(f"cannot execute {type(plan).__name__}")
        return 0


def _write(table: Table, data: pa.Table, columns: tuple[str, ...] | None) -> int:
    if table.has_primary_key:
        table.upsert(data, columns=columns)
    else:
        table.append(data)
    return data.num_rows


def _selected_keys(table: Table, keys: pa.Table | None, filter) -> pa.Table:
    if keys is not None:
        found = table.lookup(keys, columns=None)
        if filter is not None:
            found = found.filter(filter.bind(table.schema).to_arrow())
        return found
    return table.scan_table(None, filter)


def _delete(table: Table, plan: n.Delete) -> int:
    if not table.has_primary_key:
        raise Unsupported(f"{table.path} is a log table: log tables are append-only")
    rows = _selected_keys(table, plan.keys, plan.filter)
    if rows.num_rows:
        table.delete(rows.select(list(table.descriptor.primary_key)))
    return rows.num_rows


def _update(table: Table, plan: n.Update) -> int:
    rows = _selected_keys(table, plan.keys, plan.filter)
    if not rows.num_rows:
        return 0
    pk = list(table.descriptor.primary_key)
    data = rows.select(pk)
    for column, value in plan.assignments.items():
        field = table.schema.field(column)
        data = data.append_column(field, pa.array([value] * rows.num_rows, field.type))
    table.upsert(data, columns=pk + list(plan.assignments))
    return rows.num_rows
