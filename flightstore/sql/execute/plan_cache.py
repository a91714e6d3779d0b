"""Plans by statement shape: SQL text -> plan, cached, and point lookups rebuilt without parsing.

Flight SQL asks for the same plan at GetFlightInfo and again at every DoGet, so query plans are
cached per (SQL, parameters, database, catalog version). A point lookup whose key row is exactly
its parameters (``WHERE pk1 = ? AND pk2 = ?``) becomes a **template**: later parameter values skip
parsing and planning. A literal point lookup (``WHERE pk = 42``) teaches the template of its shape
(``WHERE pk = ?``, found by :func:`~flightstore.sql.parse.literal_shape`), so a stream of distinct
literals (as BI tools send) neither reparses nor fills the caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from flightstore.cache import LruCache
from flightstore.catalog import DEFAULT_DATABASE
from flightstore.schema import TableDescriptor, TablePath
from flightstore.sql import nodes as n
from flightstore.sql.execute.results import is_query
from flightstore.sql.parse import literal_shape
from flightstore.sql.plan import plan as plan_sql
from flightstore.store import Store

__all__ = ["MAX_TEMPLATE_LITERALS", "PlanCache", "StoreCatalog"]

MAX_TEMPLATE_LITERALS = 32  # more literals than any primary key has columns


class StoreCatalog:
    """The planner's view of the store's catalog."""

    def __init__(self, store: Store, default_database: str = DEFAULT_DATABASE) -> None:
        self.store = store
        self.default_database = default_database

    def get_table(self, path: TablePath) -> TableDescriptor:
        return self.store.catalog.get_table(path)

    def list_databases(self) -> list[str]:
        return self.store.list_databases()

    def list_tables(self, database: str) -> list[str]:
        return self.store.list_tables(database)


class PlanCache:
    """The plans of one store's statements (bounded LRU caches: plans, point-lookup templates)."""

    def __init__(self, store: Store, entries: int) -> None:
        self.store = store
        self._plans: LruCache[tuple, n.PlanNode] = LruCache(entries)
        # per template: the plan, and each key column's integer range (None: not all integers)
        self._templates: LruCache[tuple, tuple[n.PointLookup, tuple | None]] = LruCache(entries)

    def clear(self) -> None:
        """Forget every plan and template (a benchmark planning each statement anew)."""
        self._plans.clear()
        self._templates.clear()

    def plan(self, sql: str, params: Sequence[Any] | None = None,
             database: str = DEFAULT_DATABASE) -> n.PlanNode:
        """Plan ``sql``; query plans are cached per (SQL, parameters, database, catalog version).

        A literal point lookup (``WHERE pk = 42``) whose shape (``WHERE pk = ?``, found by a cheap
        scan, :func:`~flightstore.sql.parse.literal_shape`) was planned before is built from that
        shape's template without parsing, and is not cached per literal text: a stream of
        distinct literals neither reparses nor fills the caches."""
        shape = literal_shape(sql) if params is None else None
        if shape is not None and len(shape[1]) > MAX_TEMPLATE_LITERALS:
            shape = None  # a template is one key row: a long literal list (IN) never makes one
        if shape is not None:
            planned = self.from_template(*shape, database)
            if planned is not None:
                return planned
        try:
            key = (sql, None if params is None else tuple(params), database, self.store.catalog.version)
            hash(key)
        except TypeError:
            key = None
        if key is not None:
            cached = self._plans.get(key)
            if cached is not None:
                return cached
        planned = self.from_template(sql, params, database) if key is not None and shape is None else None
        if planned is None:
            planned = plan_sql(sql, StoreCatalog(self.store, database), params)
            if shape:
                self._learn_literal_shape(*shape, database, planned)
            elif key is not None:
                self._learn_template(sql, params, database, planned)
        if key is not None and is_query(planned):
            self._plans.put(key, planned)
        return planned

    def _learn_template(self, sql: str, params: Sequence[Any] | None, database: str,
                        planned: n.PlanNode) -> None:
        """Remember ``sql`` as a point-lookup template when its key row is exactly its parameters
        (``WHERE pk1 = ? AND pk2 = ?``): later parameter values then skip parsing and planning."""
        if not params or not isinstance(planned, n.PointLookup) or planned.filter is not None:
            return
        keys = planned.keys
        if keys.num_rows != 1 or keys.num_columns != len(params):
            return
        if list(keys.to_pylist()[0].values()) != list(params):
            return
        types = keys.schema.types
        ranges = tuple(_int_range(t) for t in types) if all(pa.types.is_integer(t) for t in types) else None
        self._templates.put((sql, database, self.store.catalog.version), (planned, ranges))

    def _learn_literal_shape(self, shape: str, values: list, database: str, planned: n.PlanNode) -> None:
        """A literal point lookup (``WHERE id = 42``) teaches the template of its shape
        (``WHERE id = ?``) when planning the shape with its literals gives the same lookup."""
        if not isinstance(planned, n.PointLookup) or planned.filter is not None:
            return
        try:
            as_template = plan_sql(shape, StoreCatalog(self.store, database), values)
        except Exception:  # noqa: BLE001 - a shape that does not plan simply teaches nothing
            return
        if isinstance(as_template, n.PointLookup) and as_template.keys.equals(planned.keys) \
                and as_template.columns == planned.columns:
            self._learn_template(shape, values, database, as_template)

    def from_template(self, sql: str, params: Sequence[Any] | None, database: str) -> n.PlanNode | None:
        """The point lookup of ``sql`` with ``params`` built from its learned template, or None
        (no template, or values the planner should judge: nulls, lossy conversions)."""
        if not params:
            return None
        learned = self._templates.get((sql, database, self.store.catalog.version))
        if learned is None or len(params) != learned[0].keys.num_columns:
            return None
        template = learned[0]
        if any(v is None for v in params):
            return None  # a null key: let the planner decide
        try:
            arrays = [pa.array([value], field.type) for value, field in zip(params, template.keys.schema)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
            return None  # the planner explains what is wrong with the value
        if any(array[0].as_py() != value for array, value in zip(arrays, params)):
            return None  # a lossy conversion: let the planner decide
        keys = pa.Table.from_arrays(arrays, schema=template.keys.schema)
        return n.PointLookup(table=template.table, keys=keys, columns=template.columns, filter=None)

    def point_key(self, sql: str, params: Sequence[Any] | None,
                  database: str) -> tuple[n.PointLookup, tuple[int, ...]] | None:
        """For a point lookup by a primary key of integer columns whose template was learned
        (``WHERE id = 42``, or ``WHERE id = ?`` with its parameters): the template and the key
        as Python ints, without planning or any Arrow array (the caller reads the row by them:
        :func:`~flightstore.sql.execute.lookups.point_row`). None otherwise: the caller plans
        ``sql`` (other key types, a null, a value out of its column's range, a new shape)."""
        if params is None:
            shape = literal_shape(sql)
            if shape is None:
                return None
            sql, params = shape
        if not params or len(params) > MAX_TEMPLATE_LITERALS:
            return None
        learned = self._templates.get((sql, database, self.store.catalog.version))
        if learned is None or learned[1] is None or len(params) != len(learned[1]):
            return None
        for value, (low, high) in zip(params, learned[1]):
            if type(value) is not int or not low <= value <= high:
                return None
        return learned[0], tuple(params)


def _int_range(t: pa.DataType) -> tuple[int, int]:
    """The values of integer type ``t``."""
    if pa.types.is_signed_integer(t):
        return -(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1
    return 0, (1 << t.bit_width) - 1
