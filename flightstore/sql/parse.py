"""SQL text -> one sqlglot statement, in the Flink SQL dialect Fluss users write.

The dialect is sqlglot's default (ANSI-ish) dialect plus backtick-quoted identifiers, which parses
Flink DDL (``STRING``, ``BYTES``, ``TIMESTAMP_LTZ(3)``, ``PRIMARY KEY (..) NOT ENFORCED``,
``PARTITIONED BY``, ``WITH ('k' = 'v')``) as is. Statements sqlglot only knows as opaque commands
(``SHOW ...``, ``EXPLAIN ...``) and the access-control statements (``GRANT``, ``REVOKE``,
``SHOW GRANTS``: :mod:`flightstore.sql.grants`) are recognised from the token stream before parsing.

Every failure is a :class:`~flightstore.errors.SqlError` whose message carries sqlglot's description
with the line, column and offending text; a well-formed statement flightstore does not implement is
:class:`~flightstore.errors.Unsupported` naming the statement kind.

Parameters (``?`` and ``$1`` style) are substituted by :func:`bind_parameters` before planning, as
literals, so the plan and any residual SQL carry plain values.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import difflib
import re
from dataclasses import dataclass
from typing import Any, Sequence

import sqlglot
from sqlglot import exp, parser, tokens
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from flightstore.errors import SqlError, Unsupported
from flightstore.sql import dates, escapes
from flightstore.sql.grants import parse_grant, parse_show_grants

__all__ = [
    "FlinkSql", "DIALECT", "Show", "Explain", "Alter", "Statement", "parse_statement", "placeholders",
    "bind_parameters", "value_to_sql", "literal_shape", "replace_all",
]


class FlinkSql(Dialect):
    """sqlglot's default dialect with Flink's backtick identifiers and ``X'..'`` bytes.

    NULLs sort last in both directions unless the query says ``NULLS FIRST``: DuckDB's rule, which
    the server advertises as SqlInfo ``SQL_NULL_ORDERING`` = sorted at end. (sqlglot's default,
    "NULLs are small", would rewrite ``ORDER BY x`` to ``NULLS FIRST`` on the way to DuckDB.)
    """

    NULL_ORDERING = "nulls_are_last"

    class Tokenizer(tokens.Tokenizer):
        IDENTIFIERS = ['"', "`"]
        HEX_STRINGS = [("x'", "'"), ("X'", "'")]

    class Parser(parser.Parser):
        # Date functions in the forms DuckDB, PostgreSQL, Flink, JDBC and BI tools write (.dates).
        FUNCTIONS = {**parser.Parser.FUNCTIONS, **dates.FUNCTIONS}
        # LOCALTIMESTAMP and LOCALTIME without parentheses, like CURRENT_TIMESTAMP (else a column)
        NO_PAREN_FUNCTIONS = {**parser.Parser.NO_PAREN_FUNCTIONS, TokenType.LOCALTIMESTAMP: exp.Localtimestamp,
                              TokenType.LOCALTIME: exp.Localtime}


DIALECT = FlinkSql

_PARAM_NAME = re.compile(r"^\$(\d+)$")


@dataclass(frozen=True)
class Show:
    """``SHOW DATABASES`` (``what='databases'``), ``SHOW TABLES [IN|FROM db]`` or
    ``SHOW PARTITIONS [db.]t`` (``table``)."""

    what: str
    database: str | None = None
    table: str | None = None


@dataclass(frozen=True)
class Alter:
    """``ALTER TABLE ...``: its text and tokens, parsed action by action by
    :mod:`flightstore.sql.alter` (sqlglot knows only some of Flink's forms)."""

    text: str
    tokens: tuple


@dataclass(frozen=True)
class Explain:
    """``EXPLAIN [PLAN FOR] <statement>``."""

    statement: "Statement"


Statement = Any  # exp.Expression | Show | Explain | GrantStatement | ShowGrantsStatement


def _tokenize(sql: str) -> list[tokens.Token]:
    try:
        return FlinkSql().tokenize(sql)
    except TokenError as exc:
        raise SqlError(f"cannot read the SQL text: {exc}") from None


# What literal_shape scans for, left to right: quoted text first (a number inside a string or an
# identifier is not a literal), then whole numbers (``1.5``, ``1e3`` and ``t1`` are never split).
_LEXEMES = re.compile(r"""
    (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<number>(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]))
  | (?P<stray>['"`\\]|/\*)
""", re.VERBOSE | re.DOTALL)
_SIGN_CONTEXT = "=(,<>"  # a '-' right after one of these negates the number that follows


def literal_shape(sql: str) -> tuple[str, list[int | str]] | None:
    """``sql`` with its integer and string literals replaced by ``?``, and those literals in order;
    None when it has none or when its text is not plain enough to scan without the SQL tokenizer.
    ``WHERE id = 42`` and ``WHERE id = 7`` share a shape, so a point lookup sent as literal SQL (as
    BI tools do) reuses the plan of its shape without being parsed.

    A regular-expression scan, not sqlglot's tokenizer (which cost more than the lookup itself).
    It is conservative: strings are ``'...'`` with ``''`` for a quote; a string with a backslash or
    a prefix (``X'..'``, ``N'..'``), or an unterminated quote or comment, gives None. A ``-`` after
    ``=``, ``(``, ``,``, ``<`` or ``>`` belongs to the number. Shapes are only ever used through a
    template the planner confirmed (:meth:`flightstore.sql.execute.Executor.plan`)."""
    pieces: list[str] = []
    values: list[int | str] = []
    position = 0
    for match in _LEXEMES.finditer(sql):
        kind = match.lastgroup
        start = match.start()
        if kind == "stray":
            return None
        if kind == "string":
            text = match.group()
            if "\\" in text or (start and (sql[start - 1].isalnum() or sql[start - 1] == "_")):
                return None
            value: int | str = text[1:-1].replace("''", "'")
        elif kind == "number" and match.group().isdigit():
            value = int(match.group())
            before = sql[:start].rstrip()
            if before.endswith("-") and before[:-1].rstrip()[-1:] in tuple(_SIGN_CONTEXT):
                start = len(before) - 1
                value = -value
        else:
            continue
        pieces.append(sql[position:start])
        pieces.append("?")
        values.append(value)
        position = match.end()
    if not values:
        return None
    pieces.append(sql[position:])
    return "".join(pieces), values


# sqlglot names what is missing by its expression classes; say it in SQL words.
_OPERATORS = {
    "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%", "DPipe": "||", "EQ": "=", "NEQ": "<>",
    "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=", "And": "AND", "Or": "OR", "Like": "LIKE",
    "ILike": "ILIKE", "Is": "IS", "In": "IN", "Between": "BETWEEN", "NullSafeEQ": "<=>",
}
_MISSING = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*\.(\w+)'>")
_DESCRIPTIONS = {
    "Invalid expression / Unexpected token": "unexpected text",
    "Expecting )": "a ')' is missing",
    "Expecting (": "a '(' is missing",
}


def _describe(description: str) -> str:
    """A sqlglot error description in the user's terms (no sqlglot class names)."""
    match = _MISSING.search(description)
    if match:
        keyword, node = match.groups()
        if node in _OPERATORS:
            side = "left" if keyword == "this" else "right"
            return f"the operator {_OPERATORS[node]} has no {side}-hand operand"
        name = re.sub(r"(?<!^)(?=[A-Z])", " ", node).upper()
        if keyword in ("this", "expression", "expressions"):
            return f"{name} needs an expression after it"
        return f"{name} is incomplete ({keyword.replace('_', ' ')} missing)"
    if "sqlglot" in description or "<class" in description:
        return "the statement is incomplete or malformed"
    return _DESCRIPTIONS.get(description, description)


def _syntax_error(exc: ParseError) -> SqlError:
    if not exc.errors:
        return SqlError(f"syntax error: {_describe(str(exc))}")
    first = exc.errors[0]
    near = (first.get("highlight") or "").strip()
    where = f"line {first.get('line')}, column {first.get('col')}"
    context = f" near {near!r}" if near else " at the end of the statement"
    return SqlError(f"syntax error at {where}{context}: {_describe(first.get('description') or '')}")


def _split_statements(sql: str, toks: list[tokens.Token]) -> list[tuple[str, list[tokens.Token]]]:
    """Split on top-level semicolons; each part keeps its source text and tokens."""
    parts: list[tuple[str, list[tokens.Token]]] = []
    current: list[tokens.Token] = []
    for token in toks:
        if token.token_type == TokenType.SEMICOLON:
            if current:
                parts.append((sql[current[0].start: current[-1].end + 1], current))
            current = []
        else:
            current.append(token)
    if current:
        parts.append((sql[current[0].start: current[-1].end + 1], current))
    return parts


def _parse_show(text: str) -> Any:
    # The tokenizer keeps everything after SHOW as one opaque string: re-tokenize that text.
    toks = _tokenize(text[4:].strip())
    words = ["SHOW"] + [t.text.upper() for t in toks]
    toks = [None] + toks  # type: ignore[list-item]
    if words[1:] == ["DATABASES"] or words[1:] == ["SCHEMAS"]:
        return Show("databases")
    if len(words) >= 2 and words[1] == "GRANTS":
        return parse_show_grants(toks[2:])  # type: ignore[arg-type]
    if len(words) >= 2 and words[1] == "TABLES":
        if len(words) == 2:
            return Show("tables")
        if len(words) == 4 and words[2] in ("IN", "FROM"):
            return Show("tables", toks[3].text)  # type: ignore[union-attr]
        raise SqlError(f"syntax error in {text!r}: expected SHOW TABLES [IN|FROM database]")
    if len(words) >= 2 and words[1] == "PARTITIONS":
        name = "".join(t.text if t.token_type != TokenType.DOT else "." for t in toks[2:])
        if len(toks) < 3 or not name or words[-1] == ".":
            raise SqlError(f"syntax error in {text!r}: expected SHOW PARTITIONS [database.]table")
        return Show("partitions", table=name)
    raise Unsupported(f"unsupported statement: {' '.join(words[:3])}")


def parse_statement(sql: str) -> Statement:
    """Parse exactly one statement (a trailing ``;`` is fine).

    Returns a sqlglot expression, or :class:`Show` / :class:`Explain` for statements sqlglot keeps
    opaque. Raises SqlError for syntax errors, empty input or several statements.
    """
    if not isinstance(sql, str):
        raise SqlError(f"SQL must be a string, not {type(sql).__name__}")
    toks = _tokenize(sql)
    expanded = escapes.expand(sql, toks)  # JDBC {fn ...}, {d '...'}, {ts '...'}
    if expanded != sql:
        sql, toks = expanded, _tokenize(expanded)
    statements = _split_statements(sql, toks)
    if not statements:
        raise SqlError("empty SQL statement")
    if len(statements) > 1:
        raise SqlError(f"expected one SQL statement, got {len(statements)}; send them one by one")
    text, toks = statements[0]
    head = toks[0].text.upper()
    if head == "SHOW":
        return _parse_show(text)
    if head in ("GRANT", "REVOKE"):
        return parse_grant(toks)
    if head == "ALTER":
        return Alter(text, tuple(toks))
    if head == "EXPLAIN":
        inner = re.sub(r"^PLAN\s+FOR\b", "", text[len(toks[0].text):].strip(), flags=re.I).strip()
        if not inner:
            raise SqlError("EXPLAIN needs a statement to explain")
        return Explain(parse_statement(inner))
    if toks[0].token_type == TokenType.VAR:  # a word no statement of ours starts with
        if head in _OTHER_STATEMENTS:  # well-formed elsewhere (START TRANSACTION, ATTACH...)
            raise Unsupported(f"unsupported statement: {head}")
        raise _not_a_statement(toks[0])  # a misspelling: SELEC, INSRT...
    text = _number_question_marks(text, toks)
    try:
        parsed = sqlglot.parse(text, read=FlinkSql)
    except ParseError as exc:
        raise _syntax_error(exc) from None
    except TokenError as exc:
        raise SqlError(f"cannot read the SQL text: {exc}") from None
    parsed = [p for p in parsed if p is not None]
    if len(parsed) != 1:
        raise SqlError(f"expected one SQL statement, got {len(parsed)}")
    statement = parsed[0]
    if isinstance(statement, exp.Command):
        raise Unsupported(f"unsupported statement: {statement.name.upper()}")
    if isinstance(statement, (exp.Condition, exp.Alias)) and not isinstance(statement, exp.Query):
        raise _not_a_statement(toks[0])  # an expression alone (``oops``, ``1 + 1``) is no statement
    return _normalize_placeholders(dates.normalize(statement))


# Statements of other SQL dialects that flightstore does not run (UNIMPLEMENTED, not a syntax error).
_OTHER_STATEMENTS = frozenset({
    "ATTACH", "CHECKPOINT", "CLOSE", "COMMENT", "DEALLOCATE", "DECLARE", "DETACH", "EXECUTE", "EXPORT",
    "FETCH", "IMPORT", "INSTALL", "LIST", "LOCK", "MSCK", "OPEN", "PREPARE", "REFRESH", "RELEASE", "RENAME",
    "RESET", "SAVEPOINT", "START", "SUMMARIZE", "UNLOCK", "UPSERT"})
_STATEMENT_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "USE", "SHOW",
                    "DESCRIBE", "EXPLAIN", "GRANT", "REVOKE", "WITH", "VALUES")


def _not_a_statement(first: tokens.Token) -> SqlError:
    """The syntax error of a statement that does not start with a statement keyword."""
    column = first.col - len(first.text) + 1  # sqlglot's col is where the token ends
    guess = difflib.get_close_matches(first.text.upper(), _STATEMENT_WORDS, n=1, cutoff=0.75)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return SqlError(f"syntax error at line {first.line}, column {column} near {first.text!r}: a statement "
                    f"starts with {', '.join(_STATEMENT_WORDS[:-1])} or {_STATEMENT_WORDS[-1]}{hint}")


def _number_question_marks(text: str, toks: list[tokens.Token]) -> str:
    """Rewrite ``?`` placeholders as ``$1``, ``$2``... (text order) so every parameter is numbered."""
    marks = [t for t in toks if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    if not marks:
        return text
    if any(t.token_type == TokenType.VAR and _PARAM_NAME.match(t.text) for t in toks) or \
            any(t.token_type == TokenType.PARAMETER for t in toks):
        raise SqlError("do not mix ? and $n parameter styles in one statement")
    offset = toks[0].start
    pieces, last = [], 0
    for number, mark in enumerate(marks, start=1):
        pieces.append(text[last: mark.start - offset])
        pieces.append(f"${number}")
        last = mark.end + 1 - offset
    pieces.append(text[last:])
    return "".join(pieces)


def _normalize_placeholders(statement: exp.Expression) -> exp.Expression:
    """Turn ``$1``-style names (parsed as columns) into numbered placeholders."""
    replace_all([(column, exp.Placeholder(this=column.name[1:]))
                 for column in statement.find_all(exp.Column)
                 if not column.table and isinstance(column.this, exp.Identifier) and not column.this.quoted
                 and _PARAM_NAME.match(column.name)])
    return statement


def replace_all(replacements: Sequence[tuple[exp.Expression, exp.Expression]]) -> None:
    """Swap each ``old`` node for its ``new`` one, in linear time: sqlglot's ``replace`` re-parents
    the whole list a node sits in, so replacing every item of ``IN (<n values>)`` one by one
    costs n² (20k values: minutes)."""
    for old, new in replacements:
        parent = old.parent
        siblings = parent.args.get(old.arg_key) if parent is not None else None
        if not isinstance(siblings, list) or old.index is None or old.index >= len(siblings) \
                or siblings[old.index] is not old:
            old.replace(new)
            continue
        node = parent
        while node is not None and node._hash is not None:  # as sqlglot's set(): cached hashes go
            node._hash = None
            node = node.parent
        siblings[old.index] = new
        new.parent, new.arg_key, new.index = parent, old.arg_key, old.index
        old.parent = None


def placeholders(statement: exp.Expression) -> list[tuple[exp.Placeholder, int]]:
    """Every placeholder with its 0-based parameter index, in text order.

    :func:`parse_statement` numbers ``?`` placeholders left to right, so ``?`` and ``$n`` both
    arrive here as ``$n``, referring to parameter ``n - 1``.
    """
    result = []
    for node in statement.find_all(exp.Placeholder):
        if not str(node.this or "").isdigit():
            raise SqlError(f"unsupported parameter {node.sql()!r}; use ? or $1, $2, ...")
        number = int(node.this)
        if number < 1:
            raise SqlError(f"parameter ${number} is invalid; parameters count from $1")
        result.append((node, number - 1))
    result.sort(key=lambda pair: pair[1])
    return result


def value_to_sql(value: Any) -> exp.Expression:
    """A Python parameter value as a sqlglot literal expression."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, decimal.Decimal)):
        text = str(value)
        return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") \
            else exp.Literal.number(text)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return exp.Cast(this=exp.Literal.string(str(value)), to=exp.DataType.build("DOUBLE"))
        text = repr(value)
        return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") \
            else exp.Literal.number(text)
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, _dt.datetime):
        return exp.Cast(this=exp.Literal.string(value.isoformat(sep=" ")),
                        to=exp.DataType.build("TIMESTAMP"))
    if isinstance(value, _dt.date):
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build("DATE"))
    if isinstance(value, _dt.time):
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build("TIME"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return exp.HexString(this=bytes(value).hex())
    raise SqlError(f"unsupported parameter value {value!r} of type {type(value).__name__}")


def bind_parameters(statement: exp.Expression, params: Sequence[Any] | None) -> exp.Expression:
    """Replace every placeholder by the literal of its parameter (in place; returns the statement).

    Raises SqlError when the number of parameters does not match the placeholders.
    """
    found = placeholders(statement)
    params = list(params or [])
    needed = max((index for _, index in found), default=-1) + 1
    if needed != len(params):
        raise SqlError(f"the statement has {needed} parameter(s) but {len(params)} value(s) "
                       "were given")
    replace_all([(node, value_to_sql(params[index])) for node, index in found])
    return statement
