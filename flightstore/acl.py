"""The access-control model of Apache Fluss, as plain values: principals, resources, operations.

A grant says *principal P may do operation O on resource R*. Resources form a hierarchy, cluster ->
database -> table, and a grant on a resource covers everything below it (``READ`` on database
``shop`` lets its holder read every table of ``shop``, present and future). Operations imply
others as in Fluss: ``ALL`` implies every operation; ``READ``, ``WRITE``, ``CREATE``, ``DROP`` and
``ALTER`` each imply ``DESCRIBE``.

This module only describes; it does no I/O and knows no users. The planner (``flightstore.sql``)
names the permissions a statement needs with these values, and the server's authorizer
(``flightstore.server.authz``) keeps the grants and checks them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from flightstore.errors import InvalidInput

__all__ = ["CLUSTER", "Grant", "Operation", "Permission", "Resource"]


class Operation(enum.Enum):
    """What a principal does to a resource (Fluss's ``OperationType``, minus the filter-only ANY)."""

    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DROP = "DROP"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    ALL = "ALL"

    @classmethod
    def parse(cls, text: str) -> Operation:
        """The operation named ``text`` (any case); InvalidInput listing the valid names."""
        name = str(text).strip().upper()
        try:
            return cls[name]
        except KeyError:
            valid = ", ".join(op.value for op in cls)
            raise InvalidInput(f"unknown operation {text!r}; operations are {valid}") from None

    def implies(self, other: Operation) -> bool:
        """Whether holding ``self`` allows ``other`` (ALL allows everything, any operation
        allows DESCRIBE)."""
        return self is other or self is Operation.ALL or other is Operation.DESCRIBE


@dataclass(frozen=True)
class Resource:
    """``cluster``, a database (``database`` set) or a table (``database`` and ``table`` set)."""

    database: str | None = None
    table: str | None = None

    def __post_init__(self) -> None:
        if self.table is not None and self.database is None:
            raise InvalidInput("a table resource needs its database")

    @classmethod
    def of_database(cls, database: str) -> Resource:
        return cls(database, None)

    @classmethod
    def of_table(cls, database: str, table: str) -> Resource:
        return cls(database, table)

    @property
    def kind(self) -> str:
        """``cluster``, ``database`` or ``table``."""
        if self.database is None:
            return "cluster"
        return "database" if self.table is None else "table"

    def covers(self, other: Resource) -> bool:
        """Whether a grant on ``self`` applies to ``other`` (itself or anything below it)."""
        if self.database is None:
            return True
        if self.database != other.database:
            return False
        return self.table is None or self.table == other.table

    def ancestors(self) -> tuple[Resource, ...]:
        """``self`` and every resource above it, nearest first."""
        if self.database is None:
            return (self,)
        if self.table is None:
            return (self, CLUSTER)
        return (self, Resource(self.database), CLUSTER)

    def __str__(self) -> str:
        if self.database is None:
            return "cluster"
        if self.table is None:
            return f"database {self.database}"
        return f"table {self.database}.{self.table}"

    def to_json(self) -> dict:
        return {"database": self.database, "table": self.table}

    @classmethod
    def from_json(cls, data: dict) -> Resource:
        return cls(data.get("database"), data.get("table"))


CLUSTER = Resource()


@dataclass(frozen=True)
class Permission:
    """One operation on one resource: what a statement or RPC needs."""

    operation: Operation
    resource: Resource

    def __str__(self) -> str:
        return f"{self.operation.value} on {self.resource}"


@dataclass(frozen=True)
class Grant:
    """``principal`` may do ``operation`` on ``resource`` (and below it)."""

    principal: str
    resource: Resource
    operation: Operation

    def allows(self, principal: str, permission: Permission) -> bool:
        return (self.principal == principal and self.resource.covers(permission.resource)
                and self.operation.implies(permission.operation))

    def to_json(self) -> dict:
        return {"principal": self.principal, "operation": self.operation.value,
                "resource": self.resource.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> Grant:
        return cls(str(data["principal"]), Resource.from_json(data["resource"]),
                   Operation.parse(data["operation"]))
