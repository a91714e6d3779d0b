"""``ALTER TABLE`` in the Flink SQL form Fluss users write, and ``SHOW PARTITIONS``.

sqlglot parses only some ALTER TABLE forms (not ``RESET``, ``MODIFY``, or ``ADD (c TYPE COMMENT
'..', ...)``), so :mod:`flightstore.sql.parse` hands the statement over as an :class:`Alter` of its
source text and tokens, and this module splits it into actions (at top-level commas) and parses
each one; column definitions and value lists go through sqlglot. Grammar::

    ALTER TABLE [IF EXISTS] [db.]t action [, action ...]
    action := ADD [COLUMN] c TYPE [COMMENT '...']      | ADD (c TYPE [COMMENT '...'], ...)
            | ADD [IF NOT EXISTS] PARTITION (k = v, ...) | DROP [IF EXISTS] PARTITION (k = v, ...)
            | SET ('k' = 'v', ...)  | RESET ('k', ...)  | RENAME TO [db.]u
            | MODIFY [COLUMN] c TYPE | ALTER [COLUMN] c [SET DATA] TYPE t   (lossless widening)

Every change is checked against the table here (so a bad statement fails at planning, having
changed nothing) and again by the store when it commits (:mod:`flightstore.alter`). Dropping or
renaming columns and changing keys or the bucket count are :class:`Unsupported`, named.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp, tokens
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.tokens import TokenType

from flightstore.alter import (
    AddColumns,
    AddPartition,
    Change,
    DropPartition,
    ModifyColumn,
    PartitionLimits,
    RenameTable,
    ResetOptions,
    SetOptions,
    apply_changes,
)
from flightstore.errors import SqlError, TableNotFound, Unsupported
from flightstore.partitioning import partition_values
from flightstore.schema import TableDescriptor, TablePath
from flightstore.sql.ddl import column_field
from flightstore.sql.literals import NotALiteral, literal_value
from flightstore.sql.nodes import AlterTable, ShowPartitions
from flightstore.sql.parse import Alter, FlinkSql
from flightstore.sql.resolve import CatalogView, resolve_table

__all__ = ["plan_alter", "plan_show_partitions"]


@dataclass(frozen=True)
class _Action:
    words: tuple[str, ...]  # upper-cased token texts
    toks: tuple
    text: str


def _split(text: str, toks: list[tokens.Token]) -> list[_Action]:
    actions, current, depth = [], [], 0
    for token in toks:
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        if token.token_type == TokenType.COMMA and depth == 0:
            if not current:
                raise SqlError("ALTER TABLE: empty action between commas")
            actions.append(current)
            current = []
        else:
            current.append(token)
    if current:
        actions.append(current)
    if not actions:
        raise SqlError("ALTER TABLE needs an action: ADD, DROP PARTITION, SET, RESET, RENAME TO, MODIFY")
    return [_Action(tuple(t.text.upper() for t in a), tuple(a), text[a[0].start: a[-1].end + 1])
            for a in actions]


def _name(toks: list[tokens.Token], start: int) -> tuple[list[str], int]:
    """A possibly qualified name at ``toks[start]``: its parts and the index after it."""
    if start >= len(toks):
        raise SqlError("ALTER TABLE needs a table name")
    parts, index = [toks[start].text], start + 1
    while index + 1 < len(toks) and toks[index].token_type == TokenType.DOT:
        parts.append(toks[index + 1].text)
        index += 2
    return parts, index


def _path(parts: list[str], default_database: str) -> TablePath:
    if len(parts) == 1:
        return TablePath(default_database, parts[0])
    if len(parts) == 2:
        return TablePath(parts[0], parts[1])
    raise SqlError(f"invalid table name {'.'.join(parts)!r}; use database.table")


def _after(action: _Action, count: int) -> str:
    """The action's source text after its first ``count`` tokens."""
    if count >= len(action.toks):
        return ""
    offset = action.toks[0].start
    return action.text[action.toks[count].start - offset:]


def _columns(text: str, what: str) -> list:
    try:
        parsed = sqlglot.parse_one(f"CREATE TABLE __alter ({text})", read=FlinkSql)
    except (ParseError, SqlglotError) as exc:
        raise SqlError(f"ALTER TABLE {what}: cannot read the column definition {text!r}: {exc}") from None
    items = parsed.this.expressions if isinstance(parsed.this, exp.Schema) else []
    if not items or not all(isinstance(i, exp.ColumnDef) for i in items):
        raise SqlError(f"ALTER TABLE {what}: expected column definitions, not {text!r}")
    return [column_field(item)[0] for item in items]


def _tuple(text: str, what: str) -> list[exp.Expression]:
    try:
        node = sqlglot.parse_one(text, read=FlinkSql)
    except (ParseError, SqlglotError) as exc:
        raise SqlError(f"ALTER TABLE {what}: cannot read {text!r}: {exc}") from None
    if isinstance(node, exp.Paren):
        return [node.this]
    if isinstance(node, exp.Tuple):
        return list(node.expressions)
    raise SqlError(f"ALTER TABLE {what}: expected a parenthesized list, not {text!r}")


def _literal(node: exp.Expression, what: str) -> object:
    try:
        return literal_value(node)
    except NotALiteral:
        raise SqlError(f"ALTER TABLE {what}: {node.sql()!r} is not a literal") from None


def _partition_spec(text: str, descriptor: TableDescriptor, what: str) -> tuple[str, ...]:
    spec = {}
    for item in _tuple(text, what):
        if not isinstance(item, exp.EQ) or not isinstance(item.this, exp.Column):
            raise SqlError(f"ALTER TABLE {what}: a partition is written (key = value, ...), not "
                           f"{item.sql()!r}")
        spec[item.this.name] = _literal(item.expression, what)
    return partition_values(descriptor.partition_keys, descriptor.schema, spec,
                            f"ALTER TABLE {descriptor.path} {what}")


def _words_after(action: _Action, index: int, *expected: str) -> int:
    """The index after ``expected`` words at ``index`` (each optional word is a tuple)."""
    for word in expected:
        if index < len(action.words) and action.words[index] == word:
            index += 1
    return index


def _change(action: _Action, descriptor: TableDescriptor, default_database: str) -> Change:
    words = action.words
    head = words[0]
    if head == "ADD":
        if "PARTITION" in words[1:5]:
            index = words.index("PARTITION")
            if_not_exists = words[1:index] == ("IF", "NOT", "EXISTS")
            if index not in (1, 4) or (index == 4 and not if_not_exists):
                raise SqlError(f"ALTER TABLE: expected ADD [IF NOT EXISTS] PARTITION (...), not "
                               f"{action.text!r}")
            return AddPartition(_partition_spec(_after(action, index + 1), descriptor, "ADD PARTITION"),
                                if_not_exists)
        if len(words) > 1 and words[1].split()[:1] in (["PRIMARY"], ["CONSTRAINT"], ["WATERMARK"], ["UNIQUE"]):
            raise Unsupported(f"ALTER TABLE {descriptor.path}: {action.text!r} is not supported; the "
                              "primary key and constraints cannot change")
        if len(words) > 1 and action.toks[1].token_type == TokenType.L_PAREN:
            text = _after(action, 1).strip()
            return AddColumns(tuple(_columns(text[1:-1], "ADD")))
        start = 2 if len(words) > 1 and words[1] == "COLUMN" else 1
        return AddColumns(tuple(_columns(_after(action, start), "ADD COLUMN")))
    if head == "DROP":
        if "PARTITION" in words[1:4]:
            index = words.index("PARTITION")
            if_exists = words[1:index] == ("IF", "EXISTS")
            if index not in (1, 3) or (index == 3 and not if_exists):
                raise SqlError(f"ALTER TABLE: expected DROP [IF EXISTS] PARTITION (...), not "
                               f"{action.text!r}")
            return DropPartition(_partition_spec(_after(action, index + 1), descriptor, "DROP PARTITION"),
                                 if_exists)
        raise Unsupported(f"ALTER TABLE {descriptor.path}: {action.text!r} is not supported: columns, "
                          "keys and constraints cannot be dropped (rows already stored keep them)")
    if head == "SET":
        if len(words) < 2 or action.toks[1].token_type != TokenType.L_PAREN:
            raise SqlError(f"ALTER TABLE SET expects ('key' = 'value', ...), not {action.text!r}")
        options = []
        for item in _tuple(_after(action, 1), "SET"):
            if not isinstance(item, exp.EQ):
                raise SqlError(f"ALTER TABLE SET expects 'key' = 'value', not {item.sql()!r}")
            if isinstance(item.this, exp.Literal):
                key = _literal(item.this, "SET")
            else:
                key = item.this.name
            value = _literal(item.expression, "SET")
            if value is None:
                raise SqlError(f"ALTER TABLE SET: option '{key}' must not be NULL; use RESET")
            options.append((str(key), "true" if value is True else "false" if value is False else str(value)))
        return SetOptions(tuple(options))
    if head == "RESET":
        if len(words) < 2 or action.toks[1].token_type != TokenType.L_PAREN:
            raise SqlError(f"ALTER TABLE RESET expects ('key', ...), not {action.text!r}")
        return ResetOptions(tuple(str(_literal(item, "RESET")) for item in _tuple(_after(action, 1), "RESET")))
    if head == "RENAME":
        if len(words) >= 3 and words[1] == "TO":
            parts, end = _name(list(action.toks), 2)
            if end != len(action.toks):
                raise SqlError(f"ALTER TABLE RENAME TO expects one table name, not {action.text!r}")
            target = _path(parts, descriptor.path.database)
            return RenameTable(target)
        raise Unsupported(f"ALTER TABLE {descriptor.path}: {action.text!r} is not supported: columns "
                          "cannot be renamed")
    if head in ("MODIFY", "ALTER"):
        index = _words_after(action, 1, "COLUMN")
        text = _after(action, index).strip()
        if head == "MODIFY" and text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        if head == "ALTER":  # ALTER [COLUMN] c [SET DATA] TYPE t
            column = action.toks[index].text
            rest = list(action.words[index + 1:])
            skip = index + 1 + next((i + 1 for i, w in enumerate(rest) if w == "TYPE"), 0)
            if "TYPE" not in rest:
                raise Unsupported(f"ALTER TABLE {descriptor.path}: {action.text!r} is not supported; "
                                  "only a column's type can change (ALTER COLUMN c TYPE t)")
            text = f"{column} {_after(action, skip)}"
        fields = _columns(text, head)
        if len(fields) != 1:
            raise SqlError(f"ALTER TABLE {head} changes one column at a time")
        if not fields[0].nullable or fields[0].metadata:
            raise Unsupported(f"ALTER TABLE {descriptor.path} {head}: only the column's type can "
                              "change (not its nullability or comment)")
        return ModifyColumn(fields[0].name, fields[0].type)
    raise Unsupported(f"ALTER TABLE {descriptor.path}: unsupported action {action.text!r}")


def _merged(changes: list[Change]) -> list[Change]:
    """Every ADD COLUMN of one statement as one change, where the first was (one new version)."""
    added = [f for c in changes if isinstance(c, AddColumns) for f in c.fields]
    result: list[Change] = []
    for change in changes:
        if not isinstance(change, AddColumns):
            result.append(change)
        elif added:
            result.append(AddColumns(tuple(added)))
            added = []
    return result


def plan_alter(statement: Alter, catalog: CatalogView) -> AlterTable:
    """Plan an ALTER TABLE: the changes, checked against the table (nothing is changed here)."""
    toks = list(statement.tokens)
    if len(toks) < 3 or toks[1].token_type != TokenType.TABLE:
        raise Unsupported(f"unsupported statement: ALTER {toks[1].text.upper() if len(toks) > 1 else ''}"
                          .rstrip())
    index = 2
    if_exists = False
    if [t.text.upper() for t in toks[2:4]] == ["IF", "EXISTS"]:
        if_exists, index = True, 4
    parts, index = _name(toks, index)
    path = _path(parts, catalog.default_database)
    try:
        descriptor = resolve_table(catalog, None if len(parts) == 1 else parts[0], parts[-1])
    except TableNotFound:
        if if_exists:
            return AlterTable(table=path, changes=(), if_exists=True)
        raise
    changes = _merged([_change(action, descriptor, catalog.default_database)
                       for action in _split(statement.text, toks[index:])])
    apply_changes(descriptor, changes, PartitionLimits(10 ** 9, 10 ** 12))  # limits: the store's
    return AlterTable(table=descriptor.path, changes=tuple(changes), if_exists=if_exists)


def plan_show_partitions(name: str, catalog: CatalogView) -> ShowPartitions:
    """``SHOW PARTITIONS [db.]t``."""
    parts = [p.strip("`\"") for p in name.split(".")]
    database = parts[0] if len(parts) == 2 else None
    descriptor = resolve_table(catalog, database, parts[-1])
    if not descriptor.is_partitioned:
        raise SqlError(f"SHOW PARTITIONS: table {descriptor.path} is not partitioned")
    return ShowPartitions(table=descriptor.path)
