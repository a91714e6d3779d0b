"""A partial aggregate as it travels between the servers of a cluster: a plan, not SQL text.

The planner's partial (:mod:`flightstore.sql.partial`) is DuckDB SQL of one fixed shape::

    SELECT <key> AS "__g0", ..., <FN>(<arg>) AS "__a0", ... FROM "<input>" [AS <alias>]
    [WHERE <condition>] [GROUP BY <key>, ...]

A bucket leader that runs it for another server must not run whatever SQL a sender puts there
(a compromised or buggy peer, or anyone who learned the cluster secret, could otherwise use the
leader's DuckDB to change its settings, read files or create tables). So the partial travels as
a :class:`PartialPlan`: the grouping keys, the aggregates (``COUNT``, ``SUM``, ``MIN``, ``MAX``
of an argument, or ``COUNT(*)``) and the condition, each a row expression. The receiver parses
each expression on its own, accepts only the node kinds of :data:`ALLOWED_NODES` (columns of
the input, literals, operators, ``CASE``, casts and a list of side-effect-free scalar functions:
no subquery, no table function, no unknown function, no nested aggregate, no ``*``) and
re-derives the SQL itself (:meth:`PartialPlan.sql`). Anything else is InvalidInput.

The planner pushes a partial only when its plan passes the same check
(:func:`~flightstore.sql.partial.push_partial_aggregates` falls back to the one-step plan
otherwise), so a planned query is never refused by a leader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from flightstore.errors import InvalidInput

__all__ = ["ALLOWED_NODES", "PartialPlan"]

GROUP_PREFIX = "__g"
AGGREGATE_PREFIX = "__a"
MAX_TEXT = 65_536  # characters of all expressions of one plan
MAX_ITEMS = 1_024  # keys plus aggregates

_AGGREGATES: dict[str, type[exp.AggFunc]] = {"COUNT": exp.Count, "SUM": exp.Sum, "MIN": exp.Min,
                                             "MAX": exp.Max}

# Scalar functions a partial may use: pure functions of their arguments (no I/O, no settings, no
# randomness or clock: every leader must compute what one server would).
_FUNCTIONS = (
    "Abs", "Ceil", "Floor", "Round", "Sqrt", "Ln", "Log", "Exp", "Pow", "Sign", "Mod",
    "Lower", "Upper", "Length", "Substring", "Trim", "Concat", "ConcatWs", "Left", "Right",
    "StrPosition", "Coalesce", "Nullif", "Greatest", "Least", "If", "Case",
    "TimestampTrunc", "DateTrunc", "Extract", "Year", "Month", "Day", "Quarter", "Week", "DayOfWeek",
    "DayOfMonth", "DayOfYear", "Hour", "Minute", "Second", "TimeToStr", "StrToTime", "StrToDate",
    "Date", "DateAdd", "DateSub", "DateDiff", "TsOrDsToDate", "RegexpLike", "RegexpExtract",
    "StartsWith", "EndsWith", "Contains", "Md5", "Hex", "Unhex",
)
_STRUCTURE = (
    "Column", "Identifier", "Literal", "Boolean", "Null", "Paren", "Neg", "Not", "Cast", "TryCast",
    "DataType", "DataTypeParam", "Var", "Interval", "In", "Between", "Is", "Like", "ILike",
    "Add", "Sub", "Mul", "Div", "IntDiv", "DPipe", "EQ", "NEQ", "GT", "GTE", "LT", "LTE", "NullSafeEQ",
    "NullSafeNEQ", "And", "Or", "Xor", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    "BitwiseLeftShift", "BitwiseRightShift", "Tuple",
)
#: The expression node kinds a partial plan may hold (looked up by name: the names sqlglot lacks
#: are simply not allowed).
ALLOWED_NODES: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name) for name in (*_STRUCTURE, *_FUNCTIONS) if hasattr(exp, name))


@dataclass(frozen=True)
class PartialPlan:
    """``keys`` (row expressions, DuckDB SQL), ``aggregates`` (function name and argument; None
    for ``COUNT(*)``), ``where`` (a condition or None) and the input's ``alias`` in the planner's
    SQL (column references may be qualified by it)."""

    keys: tuple[str, ...]
    aggregates: tuple[tuple[str, str | None], ...]
    where: str | None = None
    alias: str | None = None

    # ---- from the planner's SQL ---------------------------------------------------------------
    @classmethod
    def from_sql(cls, sql: str, name: str) -> PartialPlan:
        """The plan of the planner's partial ``sql`` over the input registered as ``name``;
        InvalidInput when ``sql`` is not of the partial shape."""
        try:
            select = sqlglot.parse_one(sql, read="duckdb")
        except SqlglotError as exc:
            raise InvalidInput(f"a partial aggregate does not parse: {exc}") from None
        if not isinstance(select, exp.Select):
            raise InvalidInput("a partial aggregate is one SELECT")
        allowed_args = {"expressions", "from", "from_", "where", "group"}
        extra = [k for k, v in select.args.items() if k not in allowed_args and v not in (None, False, [], "")]
        if extra:
            raise InvalidInput(f"a partial aggregate has no {extra[0].upper()}")
        source = select.args.get("from_") or select.args.get("from")
        if source is None or not isinstance(source.this, exp.Table) or source.this.name != name \
                or source.this.args.get("db") or source.this.args.get("catalog"):
            raise InvalidInput(f"a partial aggregate reads its input {name!r} only")
        keys: list[str] = []
        aggregates: list[tuple[str, str | None]] = []
        for item in select.expressions:
            if not isinstance(item, exp.Alias):
                raise InvalidInput("every output of a partial aggregate is named __gN or __aN")
            if item.alias == f"{GROUP_PREFIX}{len(keys)}" and not aggregates:
                keys.append(item.this.sql(dialect="duckdb"))
                continue
            if item.alias != f"{AGGREGATE_PREFIX}{len(aggregates)}":
                raise InvalidInput(f"unexpected output {item.alias!r} of a partial aggregate")
            aggregates.append(_aggregate_of(item.this))
        group = select.args.get("group")
        grouped = [g.sql(dialect="duckdb") for g in group.expressions] if group is not None else []
        if grouped != keys:
            raise InvalidInput("a partial aggregate groups by its keys, in order")
        where = select.args.get("where")
        alias = source.this.alias or None
        return cls(tuple(keys), tuple(aggregates), where.this.sql(dialect="duckdb") if where else None, alias)

    # ---- the wire ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "aggregates": [[fn, arg] for fn, arg in self.aggregates],
                "where": self.where, "alias": self.alias}

    @classmethod
    def from_json(cls, data: Any) -> PartialPlan:
        """The plan a peer sent; InvalidInput when it is malformed (its expressions are checked
        by :meth:`sql`)."""
        if not isinstance(data, Mapping):
            raise InvalidInput("a partial aggregate travels as a plan object")
        keys, aggregates = data.get("keys"), data.get("aggregates")
        where, alias = data.get("where"), data.get("alias")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InvalidInput("a partial plan's keys are expression texts")
        if not isinstance(aggregates, list) or not aggregates or not all(
                isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                and (a[1] is None or isinstance(a[1], str)) for a in aggregates):
            raise InvalidInput("a partial plan's aggregates are [function, argument] pairs")
        if where is not None and not isinstance(where, str):
            raise InvalidInput("a partial plan's condition is an expression text")
        if alias is not None and not isinstance(alias, str):
            raise InvalidInput("a partial plan's alias is a name")
        return cls(tuple(keys), tuple((fn, arg) for fn, arg in aggregates), where, alias)

    # ---- checked SQL ---------------------------------------------------------------------------
    def sql(self, name: str, columns: Iterable[str]) -> str:
        """The partial's DuckDB SQL over the input registered as ``name`` with ``columns``,
        derived here from the checked parts (see the module docstring); InvalidInput when a
        part is not allowed."""
        if len(self.keys) + len(self.aggregates) > MAX_ITEMS:
            raise InvalidInput(f"a partial aggregate has at most {MAX_ITEMS} keys and aggregates")
        texts = [*self.keys, *(a for _, a in self.aggregates if a is not None), self.where or ""]
        if sum(len(t) for t in texts) > MAX_TEXT:
            raise InvalidInput(f"a partial aggregate's expressions exceed {MAX_TEXT} characters")
        known = {c.lower() for c in columns}
        qualifiers = {q.lower() for q in (name, self.alias) if q}
        keys = [_expression(k, known, qualifiers) for k in self.keys]
        outputs = [exp.alias_(k, f"{GROUP_PREFIX}{i}", quoted=True) for i, k in enumerate(keys)]
        for j, (fn, arg) in enumerate(self.aggregates):
            kind = _AGGREGATES.get(fn.upper())
            if kind is None:
                raise InvalidInput(f"a partial aggregate computes COUNT, SUM, MIN or MAX, not {fn!r}")
            if arg is None and kind is not exp.Count:
                raise InvalidInput(f"{fn.upper()}(*) is not an aggregate")
            argument = exp.Star() if arg is None else _expression(arg, known, qualifiers)
            outputs.append(exp.alias_(kind(this=argument), f"{AGGREGATE_PREFIX}{j}", quoted=True))
        table = exp.Table(this=exp.to_identifier(name, quoted=True))
        if self.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(self.alias, quoted=True)))
        select = exp.Select(expressions=outputs).from_(table)
        if self.where is not None:
            select = select.where(_expression(self.where, known, qualifiers))
        if keys:
            select.set("group", exp.Group(expressions=[k.copy() for k in keys]))
        return select.sql(dialect="duckdb")

    def check(self, name: str, columns: Sequence[str]) -> bool:
        """Whether a leader accepts this plan (the planner pushes only such partials)."""
        try:
            self.sql(name, columns)
        except InvalidInput:
            return False
        return True


def _aggregate_of(node: exp.Expression) -> tuple[str, str | None]:
    for fn, kind in _AGGREGATES.items():
        if type(node) is kind:
            if node.args.get("distinct") or getattr(node, "expressions", None):
                break
            argument = node.this
            if isinstance(argument, exp.Star):
                return fn, None
            if argument is None:
                break
            return fn, argument.sql(dialect="duckdb")
    raise InvalidInput(f"a partial aggregate computes COUNT, SUM, MIN or MAX, not {node.sql(dialect='duckdb')}")


def _expression(text: str, columns: set[str], qualifiers: set[str]) -> exp.Expression:
    """``text`` parsed as one row expression whose every node is allowed and whose columns are
    the input's; InvalidInput otherwise."""
    try:
        node = sqlglot.parse_one(text, read="duckdb")
    except (SqlglotError, RecursionError) as exc:
        raise InvalidInput(f"a partial aggregate's expression does not parse: {exc}") from None
    for part in node.walk():
        if not isinstance(part, ALLOWED_NODES) or isinstance(part, exp.AggFunc):
            raise InvalidInput(f"a partial aggregate may not use {type(part).__name__} ({text[:80]!r})")
        if isinstance(part, exp.In) and (part.args.get("query") or part.args.get("unnest")):
            raise InvalidInput("a partial aggregate's IN lists values, not a query")
        if isinstance(part, exp.Column):
            if part.args.get("db") or part.args.get("catalog") or \
                    (part.table and part.table.lower() not in qualifiers):
                raise InvalidInput(f"a partial aggregate reads its input's columns only, not {part.sql()}")
            if part.name.lower() not in columns:
                raise InvalidInput(f"the input of a partial aggregate has no column {part.name!r}")
    return node
