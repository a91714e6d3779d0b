"""The permissions a plan needs, in Fluss's model (:mod:`flightstore.acl`). Pure: a plan in, a
tuple of :class:`~flightstore.acl.Permission` out; the server's authorizer checks them.

=====================================  ===========================================================
plan                                   needs
=====================================  ===========================================================
lookups, scans, counts, changelogs,    READ on the table
union reads, ``t$lake`` (and its
``$snapshots`` / ``$status``)
residual SQL                           READ on every input table (joins, subqueries, CTE sources)
INSERT ... VALUES                      WRITE on the table
INSERT ... SELECT                      WRITE on the target, READ on every table the query reads
DELETE / UPDATE                        WRITE on the table (and READ when a WHERE selects the rows:
                                       the affected-row count tells what matched)
CREATE DATABASE                        CREATE on the cluster
DROP DATABASE                          DROP on the database
CREATE TABLE                           CREATE on its database
DROP TABLE                             DROP on the table
ALTER TABLE (columns, options,         ALTER on the table
partitions, RENAME TO)
DESCRIBE t, SHOW PARTITIONS t          DESCRIBE on the table
USE db                                 nothing but seeing ``db`` (below)
EXPLAIN stmt                           DESCRIBE on everything ``stmt`` touches
GRANT / REVOKE                         ALL on the resource (as Fluss's CREATE_ACLS / DROP_ACLS)
SHOW DATABASES / TABLES / GRANTS       nothing: the server lists only what the caller may describe
=====================================  ===========================================================

Before any of that, every object a plan names (:func:`plan_resources`) must be one the caller
*sees*: a table it may DESCRIBE, a database listed to it (DESCRIBE on it, or a grant on one of its
tables). An object the caller does not see answers exactly like an absent one: the server plans
the statement again in a catalog without it (:class:`~flightstore.sql.resolve.VisibleCatalog`).
"""

from __future__ import annotations

from flightstore.acl import CLUSTER, Operation, Permission, Resource
from flightstore.schema import TablePath
from flightstore.sql import nodes as n

__all__ = ["plan_resources", "plan_tables", "required_permissions", "table_resource"]


def table_resource(path: TablePath) -> Resource:
    return Resource.of_table(path.database, path.table)


def _read(path: TablePath) -> Permission:
    return Permission(Operation.READ, table_resource(path))


def plan_tables(plan: n.PlanNode) -> tuple[TablePath, ...]:
    """The tables a query plan reads (in order, once each); () for plans that read none."""
    if isinstance(plan, n.Residual):
        found = [item.table for item in plan.inputs]
    elif isinstance(plan, (n.PointLookup, n.PrefixLookup, n.Scan, n.RangeScan, n.UnionScan, n.LakeScan,
                           n.Count, n.Changelog)):
        found = [plan.table]
    else:
        found = []
    return tuple(dict.fromkeys(found))


def required_permissions(plan: n.PlanNode) -> tuple[Permission, ...]:
    """Every permission ``plan`` needs, without duplicates, in a stable order."""
    return tuple(dict.fromkeys(_required(plan)))


def _required(plan: n.PlanNode) -> list[Permission]:
    if isinstance(plan, n.Explain):
        return [Permission(Operation.DESCRIBE, p.resource) for p in _required(plan.plan)]
    reads = plan_tables(plan)
    if reads:
        return [_read(path) for path in reads]
    if isinstance(plan, n.Insert):
        return [Permission(Operation.WRITE, table_resource(plan.table))]
    if isinstance(plan, n.InsertSelect):
        return [Permission(Operation.WRITE, table_resource(plan.table)), *_required(plan.query)]
    if isinstance(plan, (n.Delete, n.Update)):
        needs = [Permission(Operation.WRITE, table_resource(plan.table))]
        if plan.keys is not None or plan.filter is not None:
            needs.append(_read(plan.table))
        return needs
    if isinstance(plan, n.CreateDatabase):
        return [Permission(Operation.CREATE, CLUSTER)]
    if isinstance(plan, n.DropDatabase):
        return [Permission(Operation.DROP, Resource.of_database(plan.name))]
    if isinstance(plan, n.CreateTable):
        return [Permission(Operation.CREATE, Resource.of_database(plan.descriptor.path.database))]
    if isinstance(plan, n.DropTable):
        return [Permission(Operation.DROP, table_resource(plan.table))]
    if isinstance(plan, (n.Describe, n.ShowPartitions)):
        return [Permission(Operation.DESCRIBE, table_resource(plan.table))]
    if isinstance(plan, n.AlterTable):
        return [Permission(Operation.ALTER, table_resource(plan.table))]
    if isinstance(plan, (n.Grant, n.Revoke)):
        return [Permission(Operation.ALL, plan.resource)]
    return []  # SHOW DATABASES / TABLES / GRANTS: filtered by the server


def plan_resources(plan: n.PlanNode) -> tuple[Resource, ...]:
    """Every catalog object ``plan`` names (those it needs a permission on, the database of SHOW
    TABLES and USE, the resource of SHOW GRANTS ON), without duplicates: the objects the caller
    must see before it learns anything of the plan."""
    found = [permission.resource for permission in required_permissions(plan)]
    if isinstance(plan, (n.ShowTables, n.UseDatabase)):
        found.append(Resource.of_database(plan.database if isinstance(plan, n.ShowTables) else plan.name))
    elif isinstance(plan, n.ShowGrants) and plan.resource is not None:
        found.append(plan.resource)
    return tuple(dict.fromkeys(found))
