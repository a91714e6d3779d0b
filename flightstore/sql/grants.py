"""``GRANT``, ``REVOKE`` and ``SHOW GRANTS``: parsing and planning (pure, no I/O).

The statements speak Fluss's access-control model (:mod:`flightstore.acl`)::

    GRANT op [, op ...] ON resource TO [USER] name [, [USER] name ...]
    REVOKE op [, op ...] ON resource FROM [USER] name [, ...]
    SHOW GRANTS [FOR [USER] name] [ON resource]

    op       := READ | WRITE | CREATE | DROP | ALTER | DESCRIBE | ALL [PRIVILEGES]
    resource := CLUSTER | DATABASE db | TABLE [db.]t | [db.]t

They are read from the token stream (sqlglot's own GRANT parser knows neither ``CLUSTER`` nor
``TO USER``). A named database or table must exist; its catalog spelling is what the grant keeps.
Who may run them (ALL on the resource) is the server's authorizer's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from sqlglot import tokens
from sqlglot.tokens import TokenType

from flightstore.acl import CLUSTER, Operation, Resource
from flightstore.errors import InvalidInput, SqlError
from flightstore.sql.nodes import Grant, Revoke, ShowGrants
from flightstore.sql.resolve import CatalogView, resolve_database, resolve_table

__all__ = [
    "SHOW_GRANTS_SCHEMA",
    "GrantStatement",
    "ShowGrantsStatement",
    "parse_grant",
    "parse_show_grants",
    "plan_grant",
    "plan_show_grants",
]

SHOW_GRANTS_SCHEMA = pa.schema([
    pa.field("principal", pa.string(), nullable=False),
    pa.field("resource_type", pa.string(), nullable=False),
    pa.field("resource", pa.string(), nullable=False),
    pa.field("operation", pa.string(), nullable=False),
])

_NAME_TYPES = (TokenType.VAR, TokenType.IDENTIFIER)


@dataclass(frozen=True)
class ResourceName:
    """A resource as written: ``kind`` is cluster, database or table; names unresolved."""

    kind: str
    database: str | None = None
    table: str | None = None


@dataclass(frozen=True)
class GrantStatement:
    """A parsed GRANT (``revoke`` False) or REVOKE."""

    revoke: bool
    operations: tuple[Operation, ...]
    resource: ResourceName
    principals: tuple[str, ...]


@dataclass(frozen=True)
class ShowGrantsStatement:
    principal: str | None = None
    resource: ResourceName | None = None


class _Reader:
    """A cursor over tokens with the errors of this grammar."""

    def __init__(self, toks: list[tokens.Token], statement: str) -> None:
        self.toks = toks
        self.position = 0
        self.statement = statement

    def error(self, expected: str) -> SqlError:
        if self.position >= len(self.toks):
            return SqlError(f"{self.statement}: expected {expected} at the end of the statement")
        token = self.toks[self.position]
        return SqlError(f"{self.statement}: expected {expected}, not {token.text!r} (line {token.line}, "
                        f"column {token.col})")

    def done(self) -> bool:
        return self.position >= len(self.toks)

    def peek_word(self) -> str | None:
        if self.done():
            return None
        token = self.toks[self.position]
        return None if token.token_type == TokenType.IDENTIFIER else token.text.upper()

    def word(self, *words: str) -> bool:
        """Consume the next token when it is one of ``words`` (unquoted, any case)."""
        if self.peek_word() in words:
            self.position += 1
            return True
        return False

    def expect(self, word: str) -> None:
        if not self.word(word):
            raise self.error(word)

    def name(self, what: str) -> str:
        """An identifier (quoted or not; unquoted keywords such as ``default`` count as names)."""
        if self.done():
            raise self.error(what)
        token = self.toks[self.position]
        if token.token_type not in _NAME_TYPES and not token.text.replace("_", "").isalnum():
            raise self.error(what)
        self.position += 1
        return token.text

    def punctuation(self, kind: TokenType) -> bool:
        if not self.done() and self.toks[self.position].token_type == kind:
            self.position += 1
            return True
        return False


def _operations(reader: _Reader) -> tuple[Operation, ...]:
    found: list[Operation] = []
    while True:
        if reader.done():
            raise reader.error("an operation")
        word = reader.name("an operation (READ, WRITE, CREATE, DROP, ALTER, DESCRIBE, ALL)")
        try:
            operation = Operation.parse(word)
        except InvalidInput as exc:
            raise SqlError(f"{reader.statement}: {exc}") from None
        if operation is Operation.ALL:
            reader.word("PRIVILEGES")
        if operation not in found:
            found.append(operation)
        if not reader.punctuation(TokenType.COMMA):
            return tuple(found)


def _resource(reader: _Reader) -> ResourceName:
    if reader.word("CLUSTER"):
        return ResourceName("cluster")
    if reader.word("DATABASE", "SCHEMA"):
        return ResourceName("database", reader.name("a database name"))
    reader.word("TABLE")
    first = reader.name("a table name, DATABASE db or CLUSTER")
    if reader.punctuation(TokenType.DOT):
        return ResourceName("table", first, reader.name("a table name"))
    return ResourceName("table", None, first)


def _principals(reader: _Reader) -> tuple[str, ...]:
    found: list[str] = []
    while True:
        reader.word("USER")
        name = reader.name("a user name")
        if name not in found:
            found.append(name)
        if not reader.punctuation(TokenType.COMMA):
            return tuple(found)


def parse_grant(toks: list[tokens.Token]) -> GrantStatement:
    """Parse the tokens of one GRANT or REVOKE statement."""
    revoke = toks[0].text.upper() == "REVOKE"
    reader = _Reader(toks[1:], "REVOKE" if revoke else "GRANT")
    operations = _operations(reader)
    reader.expect("ON")
    resource = _resource(reader)
    reader.expect("FROM" if revoke else "TO")
    principals = _principals(reader)
    if not reader.done():
        raise reader.error("the end of the statement")
    return GrantStatement(revoke, operations, resource, principals)


def parse_show_grants(toks: list[tokens.Token]) -> ShowGrantsStatement:
    """Parse the tokens after ``SHOW GRANTS``."""
    reader = _Reader(toks, "SHOW GRANTS")
    principal = resource = None
    if reader.word("FOR"):
        reader.word("USER")
        principal = reader.name("a user name")
    if reader.word("ON"):
        resource = _resource(reader)
    if not reader.done():
        raise reader.error("FOR user, ON resource or the end of the statement")
    return ShowGrantsStatement(principal, resource)


def _resolve(name: ResourceName, catalog: CatalogView) -> Resource:
    if name.kind == "cluster":
        return CLUSTER
    if name.kind == "database":
        return Resource.of_database(resolve_database(catalog, name.database))  # type: ignore[arg-type]
    descriptor = resolve_table(catalog, name.database, name.table)  # type: ignore[arg-type]
    return Resource.of_table(descriptor.path.database, descriptor.path.table)


def plan_grant(statement: GrantStatement, catalog: CatalogView) -> Grant | Revoke:
    node = Revoke if statement.revoke else Grant
    return node(principals=statement.principals, operations=statement.operations,
                resource=_resolve(statement.resource, catalog))


def plan_show_grants(statement: ShowGrantsStatement, catalog: CatalogView) -> ShowGrants:
    resource = None if statement.resource is None else _resolve(statement.resource, catalog)
    return ShowGrants(principal=statement.principal, resource=resource)
