"""WHERE clauses -> the shared :mod:`flightstore.expressions` predicates, and key extraction.

:func:`to_predicate` converts what the storage can evaluate (comparisons of a column with a
literal, IN lists, IS [NOT] NULL, ``LIKE 'abc%'``, BETWEEN, AND/OR/NOT) and returns None for
anything else, so the caller keeps that part for the embedded engine. Literals are cast strictly to
the column type (a mismatch is a SqlError naming column and value).

:func:`extract_keys` finds conjuncts that pin columns to values (``=``, ``IN``, ``OR`` of ``=``)
and builds the key table: the cartesian product of the pinned values, deduplicated.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import pyarrow as pa
from sqlglot import exp

from flightstore.expressions import And, Comparison, In, IsNotNull, IsNull, Not, Or, Predicate, StartsWith
from flightstore.sql.literals import NotALiteral, cast_value, literal_value

__all__ = ["conjuncts", "to_predicate", "flatten_and", "extract_keys", "MAX_KEYS"]

MAX_KEYS = 100_000  # larger key products are scanned with a filter instead of looked up

ColumnOf = Callable[[exp.Column], "str | None"]

_COMPARISONS = {exp.EQ: "=", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The top-level AND terms of a condition (parentheses unwrapped)."""
    if node is None:
        return []
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def flatten_and(predicate: Predicate | None) -> list[Predicate]:
    if predicate is None:
        return []
    if isinstance(predicate, And):
        return flatten_and(predicate.left) + flatten_and(predicate.right)
    return [predicate]


def _literal(node: exp.Expression) -> tuple[bool, Any]:
    try:
        return True, literal_value(node)
    except NotALiteral:
        return False, None


def to_predicate(node: exp.Expression, column_of: ColumnOf, schema: pa.Schema) -> Predicate | None:
    """The predicate of ``node`` with literals cast to ``schema``; None when not convertible.

    ``column_of`` maps a column reference to its schema name, or None when the column does not
    belong to this table (the whole condition is then not convertible).
    """
    def col(node: exp.Expression) -> str | None:
        return column_of(node) if isinstance(node, exp.Column) else None

    def cast(value: Any, column: str) -> Any:
        return cast_value(value, schema.field(column).type, column)

    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        left, right = (to_predicate(n, column_of, schema) for n in (node.this, node.expression))
        return And(left, right) if left is not None and right is not None else None
    if isinstance(node, exp.Or):
        left, right = (to_predicate(n, column_of, schema) for n in (node.this, node.expression))
        return Or(left, right) if left is not None and right is not None else None
    if isinstance(node, exp.Not):
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
            name = col(inner.this)
            return IsNotNull(name) if name else None
        child = to_predicate(inner, column_of, schema)
        return Not(child) if child is not None else None
    op = _COMPARISONS.get(type(node))
    if op is not None:
        left, right = node.this, node.expression
        name = col(left)
        ok, value = _literal(right)
        if name is None or not ok:
            name, (ok, value), op = col(right), _literal(left), _FLIPPED[op]
        if name is None or not ok:
            return None
        return Comparison(name, op, cast(value, name))
    if isinstance(node, exp.In):
        name = col(node.this)
        if name is None or node.args.get("query") or node.args.get("unnest") or \
                node.args.get("field"):
            return None
        values = [_literal(v) for v in node.expressions]
        if not values or not all(ok for ok, _ in values):
            return None
        return In(name, tuple(cast(v, name) for _, v in values))
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        name = col(node.this)
        return IsNull(name) if name else None
    if isinstance(node, exp.Between):
        name = col(node.this)
        (ok_low, low), (ok_high, high) = _literal(node.args["low"]), _literal(node.args["high"])
        if name is None or not ok_low or not ok_high:
            return None
        return And(Comparison(name, ">=", cast(low, name)), Comparison(name, "<=", cast(high, name)))
    if isinstance(node, exp.Like) and not node.args.get("escape"):
        return _like(node, col)
    if isinstance(node, exp.Escape):
        return None
    if isinstance(node, exp.Column):
        name = col(node)
        if name and pa.types.is_boolean(schema.field(name).type):
            return Comparison(name, "=", True)
    return None


def _like(node: exp.Like, col: Callable[[exp.Expression], str | None]) -> Predicate | None:
    name = col(node.this)
    ok, pattern = _literal(node.expression)
    if name is None or not ok or not isinstance(pattern, str):
        return None
    if "\\" in pattern:
        return None
    stem = pattern.rstrip("%")
    if "%" in stem or "_" in stem:
        return None
    if stem == pattern:
        return Comparison(name, "=", pattern)
    return StartsWith(name, stem) if stem else IsNotNull(name)


def _pinned(predicate: Predicate) -> tuple[str, list[Any]] | None:
    """``(column, values)`` when the predicate pins one column to a finite set of values."""
    if isinstance(predicate, Comparison) and predicate.op == "=":
        return predicate.column, [predicate.value]
    if isinstance(predicate, In):
        return predicate.column, list(predicate.values)
    if isinstance(predicate, Or):
        left, right = _pinned(predicate.left), _pinned(predicate.right)
        if left and right and left[0] == right[0]:
            return left[0], left[1] + right[1]
    return None


def _dedupe(values: list[Any]) -> list[Any]:
    seen, result = set(), []
    for value in values:
        if value is not None and value not in seen:
            seen.add(value)
            result.append(value)
    return result


def extract_keys(predicates: Sequence[Predicate], key_columns: Sequence[str], schema: pa.Schema
                 ) -> tuple[pa.Table, list[Predicate]] | None:
    """The key table when every column of ``key_columns`` is pinned, with the other conjuncts.

    NULLs never match and are dropped; several pins of one column intersect. None when a key column
    is unpinned or the product would exceed :data:`MAX_KEYS`.
    """
    if not key_columns:
        return None
    values: dict[str, list[Any]] = {}
    remaining: list[Predicate] = []
    for predicate in predicates:
        pinned = _pinned(predicate)
        if pinned is None or pinned[0] not in key_columns:
            remaining.append(predicate)
            continue
        column, vals = pinned
        vals = _dedupe(vals)
        values[column] = [v for v in values[column] if v in vals] if column in values else vals
    if any(column not in values for column in key_columns):
        return None
    size = 1
    for column in key_columns:
        size *= len(values[column])
    if size > MAX_KEYS:
        return None
    rows = list(itertools.product(*(values[c] for c in key_columns)))
    arrays = [pa.array([row[i] for row in rows], schema.field(c).type)
              for i, c in enumerate(key_columns)]
    fields = [schema.field(c).with_nullable(False) for c in key_columns]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)), remaining
