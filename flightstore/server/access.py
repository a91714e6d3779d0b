"""The checks of a call's caller, in one place: what it may do (the authorizer, fed by a plan's
resources), what exists for it (objects it may not describe answer exactly as absent ones), and
what a long stream checks again while it runs (its token and grants).

Mixed into :class:`~flightstore.server.service.FlightSqlServer` (``self`` is the server, with its
store, executor, authorizer and authenticator); every read, write and action goes through these.
"""

from __future__ import annotations

from typing import Any

from pyarrow import flight

from flightstore.acl import Operation, Permission
from flightstore.catalog import DEFAULT_DATABASE
from flightstore.errors import DatabaseNotFound, TableNotFound, Unauthenticated
from flightstore.schema import TablePath
from flightstore.server.auth import CALLER_TOKEN
from flightstore.server.recheck import StreamRecheck
from flightstore.server.rpc import _CALLER
from flightstore.sql import nodes
from flightstore.sql.execute import StoreCatalog
from flightstore.sql.plan import plan as plan_sql
from flightstore.sql.privileges import plan_resources, required_permissions, table_resource
from flightstore.sql.resolve import CatalogView

__all__ = ["AccessChecks"]


class AccessChecks:
    """Authorization, visibility and stream re-checks of the server's calls."""

    # ---- authorization: the one check, fed by the plan's resources ----------------------------
    def _authorize(self, permissions: Any) -> None:
        """Raise Unauthorized unless the caller holds every permission (a plan's, or a list)."""
        caller = _CALLER.get()
        if self.authz.is_super(caller):
            return  # no authentication, or a super user: nothing to work out (a lookup's hot path)
        if isinstance(permissions, nodes.PlanNode):
            permissions = required_permissions(permissions)
        self.authz.check(caller, permissions)

    def _authorize_table(self, operation: Operation, table: Any) -> None:
        self._authorize([Permission(operation, table_resource(table.path))])

    # ---- what exists for the caller: objects it may not describe answer as absent -------------
    def _catalog(self, database: str) -> CatalogView:
        """The planner's catalog as the caller sees it, ``database`` the default one."""
        return self.authz.catalog_view(_CALLER.get(), StoreCatalog(self.store, database))

    def _plan(self, sql: str, params: list | None, database: str) -> nodes.PlanNode:
        """:meth:`_plan_once`; in a cluster, a statement naming a database or table this server
        has not applied yet (another server just created it) is planned again once this server
        caught up with the cluster's catalog."""
        try:
            return self._plan_once(sql, params, database)
        except (DatabaseNotFound, TableNotFound):
            catch_up = getattr(self.store, "catch_up", None)
            if catch_up is None or not catch_up():
                raise
            return self._plan_once(sql, params, database)

    def _plan_once(self, sql: str, params: list | None, database: str) -> nodes.PlanNode:
        """The plan of ``sql`` for the caller. A plan (or a planning error) that names an object
        the caller may not see is made again in the caller's catalog view, so the caller gets
        exactly what an absent object gets, and no message describes a hidden table. Plans stay
        cached for everyone (:meth:`Executor.plan`); only such misses plan twice."""
        principal = _CALLER.get()
        if self.authz.is_super(principal):
            return self.executor.plan(sql, params, database)
        try:
            planned = self.executor.plan(sql, params, database)
        except Exception:  # noqa: BLE001 - its message may describe what the caller may not see
            planned = None
        if planned is None or not self.authz.sees(principal, plan_resources(planned)):
            planned = plan_sql(sql, self._catalog(database), params)
        return planned

    def _visible_table(self, name: str) -> Any:
        """The table ``name`` names (default database ``default``), opened, when the caller sees
        it; otherwise exactly the error of an absent one (DatabaseNotFound / TableNotFound)."""
        path = TablePath.parse(name, DEFAULT_DATABASE) if isinstance(name, str) else name
        principal = _CALLER.get()
        if not self.authz.is_super(principal):
            if not self.authz.sees_database(principal, path.database):
                raise DatabaseNotFound(f"database {path.database!r} does not exist")
            if not self.authz.sees_table(principal, path):
                raise TableNotFound(f"table {path} does not exist")
        return self.store.table(path)

    def _stream_recheck(self, permissions: Any) -> StreamRecheck | None:
        """The checks a long stream repeats as it runs (None without authentication): the
        caller's token is still valid and the caller still holds ``permissions`` (a plan's, or
        a list)."""
        principal, token = _CALLER.get(), CALLER_TOKEN.get()
        if self.authenticator is None or principal is None or token is None:
            return None
        if isinstance(permissions, nodes.PlanNode):
            permissions = required_permissions(permissions)
        token_check, authz = self.authenticator.stream_check(token), self.authz

        def token_valid() -> None:
            try:
                token_check()
            except flight.FlightUnauthenticatedError as exc:
                raise Unauthenticated(str(exc)) from None

        return StreamRecheck([token_valid, lambda: authz.check(principal, permissions)])
