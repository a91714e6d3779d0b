"""Authorization: the grants of a data directory and the one check every RPC goes through.

The model is Fluss's (:mod:`flightstore.acl`): a principal (the authenticated user) may do an
operation on a resource (cluster, database, table) when it holds a grant of that operation, or of
one implying it, on the resource or any resource above it. Super users (``authorizer.super-users``)
may do everything. With no authentication configured there is no principal and the server stays
open: everyone is a super user.

Grants live in ``DATA_DIR/grants.json`` (:class:`GrantsFile`), rewritten atomically on every
GRANT / REVOKE, so they survive restarts; a cluster keeps them in ZooKeeper, the same on every
server (:mod:`flightstore.cluster.security`). A denied call is
:class:`~flightstore.errors.Unauthorized` (Flight UNAUTHORIZED, gRPC PERMISSION_DENIED) naming
the user, the operation and the resource, and changes nothing.

Listings (``SHOW DATABASES``/``TABLES``/``GRANTS``, Flight SQL GetDbSchemas/GetTables) are filtered
to what the caller may DESCRIBE; a database is listed when the caller may describe it or holds a
grant on one of its tables. What is not listed to a caller does not exist for it
(:meth:`Authorizer.sees_table`, :meth:`Authorizer.sees_database`, :meth:`Authorizer.catalog_view`):
naming it answers exactly what naming an absent object answers, so a refusal (UNAUTHORIZED) only
ever concerns an object the caller may describe.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from flightstore.acl import CLUSTER, Grant, Operation, Permission, Resource
from flightstore.errors import CorruptData, Unauthorized
from flightstore.schema import TablePath
from flightstore.sql import nodes
from flightstore.sql.grants import SHOW_GRANTS_SCHEMA
from flightstore.sql.resolve import CatalogView, VisibleCatalog

__all__ = ["GRANTS_FILE", "Authorizer", "GrantsFile"]

GRANTS_FILE = "grants.json"


class GrantsFile:
    """The grants of one server, in ``DATA_DIR/grants.json`` (rewritten atomically on every
    change). A cluster keeps its grants in ZooKeeper instead
    (:class:`~flightstore.cluster.security.ClusterGrants`, the same two methods)."""

    def __init__(self, data_dir: str | os.PathLike | None) -> None:
        self._file = Path(data_dir) / GRANTS_FILE if data_dir is not None else None
        self._grants: frozenset[Grant] = frozenset()
        self._lock = threading.Lock()
        if self._file is not None and self._file.exists():
            try:
                state = json.loads(self._file.read_text(encoding="utf-8"))
                self._grants = frozenset(Grant.from_json(item) for item in state["grants"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptData(f"grants file {self._file} is corrupt: {exc}") from None

    def grants(self) -> frozenset[Grant]:
        return self._grants

    def update(self, change: Callable[[set[Grant]], set[Grant]]) -> int:
        """Apply ``change`` (current grants -> new grants) and save; how many grants changed."""
        with self._lock:
            before = self._grants
            after = frozenset(change(set(before)))
            changed = len(after ^ before)
            if changed:
                self._save(after)  # before memory: nothing half-done if the file cannot be written
                self._grants = after
        return changed

    def _save(self, grants: frozenset[Grant]) -> None:
        if self._file is None:
            return
        tmp = self._file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"version": 1, "grants": [g.to_json() for g in sorted(grants, key=_sort_key)]},
                      handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._file)


class Authorizer:
    """Grants of one data directory (or of the cluster: ``grants``), checked for ``principal``
    (None: no authentication). ``enabled`` may be a callable: a cluster authenticates only once
    it has users."""

    def __init__(self, data_dir: str | os.PathLike | None, *, enabled: bool | Callable[[], bool],
                 super_users: Iterable[str] = (), grants: Any = None) -> None:
        self._enabled = enabled
        self.super_users = frozenset(super_users)
        self.store = grants if grants is not None else GrantsFile(data_dir)

    @property
    def enabled(self) -> bool:
        return bool(self._enabled() if callable(self._enabled) else self._enabled)

    @property
    def _grants(self) -> frozenset[Grant]:
        return self.store.grants()

    # ---- checks -------------------------------------------------------------------------------
    def is_super(self, principal: str | None) -> bool:
        return not self.enabled or principal is None or principal in self.super_users

    def allowed(self, principal: str | None, permission: Permission) -> bool:
        if self.is_super(principal):
            return True
        return any(grant.allows(principal, permission) for grant in self._grants)  # type: ignore[arg-type]

    def check(self, principal: str | None, permissions: Iterable[Permission]) -> None:
        """Raise Unauthorized naming the first permission ``principal`` lacks."""
        if self.is_super(principal):
            return
        for permission in permissions:
            if not self.allowed(principal, permission):
                raise Unauthorized(f"user {principal!r} may not {permission.operation.value} "
                                   f"{permission.resource} (no grant of {permission.operation.value} "
                                   f"on it or above it)")

    # ---- what a caller sees (listings, and what exists for it) --------------------------------
    def sees_table(self, principal: str | None, path: TablePath) -> bool:
        """Whether table ``path`` exists for ``principal``: it may DESCRIBE it."""
        return self.allowed(principal, Permission(Operation.DESCRIBE, Resource.of_table(path.database, path.table)))

    def sees_database(self, principal: str | None, database: str) -> bool:
        """Whether ``database`` exists for ``principal``: it may DESCRIBE it or holds a grant on
        one of its tables (as SHOW DATABASES lists it)."""
        if self.allowed(principal, Permission(Operation.DESCRIBE, Resource.of_database(database))):
            return True
        return any(g.principal == principal and g.resource.kind == "table" and g.resource.database == database
                   for g in self._grants)

    def sees(self, principal: str | None, resources: Iterable[Resource]) -> bool:
        """Whether every one of ``resources`` exists for ``principal`` (the cluster always does)."""
        if self.is_super(principal):
            return True
        for resource in resources:
            if resource.kind == "database" and not self.sees_database(principal, resource.database):  # type: ignore[arg-type]
                return False
            # Seeing a table implies seeing its database (a grant on the table lists it).
            if resource.kind == "table" and \
                    not self.sees_table(principal, TablePath(resource.database, resource.table)):  # type: ignore[arg-type]
                return False
        return True

    def catalog_view(self, principal: str | None, catalog: CatalogView) -> CatalogView:
        """``catalog`` as ``principal`` sees it (itself for super users)."""
        if self.is_super(principal):
            return catalog
        return VisibleCatalog(catalog, lambda name: self.sees_database(principal, name),
                              lambda path: self.sees_table(principal, path))

    def visible_tables(self, principal: str | None, paths: Sequence[TablePath]) -> list[TablePath]:
        if self.is_super(principal):
            return list(paths)
        return [p for p in paths if self.sees_table(principal, p)]

    def visible_databases(self, principal: str | None, databases: Sequence[str]) -> list[str]:
        if self.is_super(principal):
            return list(databases)
        return [db for db in databases if self.sees_database(principal, db)]

    def filter_listing(self, principal: str | None, plan: nodes.PlanNode, result: pa.Table) -> pa.Table:
        """``result`` of SHOW DATABASES / SHOW TABLES without the rows ``principal`` may not see."""
        if self.is_super(principal):
            return result
        if isinstance(plan, nodes.ShowDatabases):
            names = result.column(0).to_pylist()
            keep = set(self.visible_databases(principal, names))
        elif isinstance(plan, nodes.ShowTables):
            names = result.column(0).to_pylist()
            keep = {p.table for p in self.visible_tables(principal, [TablePath(plan.database, t) for t in names])}
        else:
            return result
        return result.filter(pa.array([name in keep for name in names], pa.bool_()))

    # ---- GRANT / REVOKE / SHOW GRANTS ---------------------------------------------------------
    def apply(self, plan: nodes.Grant | nodes.Revoke) -> int:
        """Add (GRANT) or remove (REVOKE) the plan's grants and save; returns how many changed.
        In a cluster it returns once every live server applied the change."""
        wanted = {Grant(principal, plan.resource, operation)
                  for principal in plan.principals for operation in plan.operations}
        if isinstance(plan, nodes.Grant):
            return self.store.update(lambda grants: grants | wanted)
        return self.store.update(lambda grants: grants - wanted)

    def show(self, principal: str | None, plan: nodes.ShowGrants) -> pa.Table:
        """The grants matching ``plan`` on resources ``principal`` may DESCRIBE (Fluss's LIST_ACLS)."""
        grants = sorted(self._grants, key=_sort_key)
        rows = [g for g in grants
                if (plan.principal is None or g.principal == plan.principal)
                and (plan.resource is None or g.resource == plan.resource)
                and self.allowed(principal, Permission(Operation.DESCRIBE, g.resource))]
        return pa.table({
            "principal": [g.principal for g in rows],
            "resource_type": [g.resource.kind.upper() for g in rows],
            "resource": [_resource_name(g.resource) for g in rows],
            "operation": [g.operation.value for g in rows],
        }, schema=SHOW_GRANTS_SCHEMA)


def _sort_key(grant: Grant) -> tuple:
    return (grant.principal, grant.resource.database or "", grant.resource.table or "", grant.operation.value)


def _resource_name(resource: Resource) -> str:
    if resource == CLUSTER:
        return "cluster"
    return resource.database if resource.table is None else f"{resource.database}.{resource.table}"
