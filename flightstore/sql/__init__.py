"""SQL text -> plan (pure): ``parse`` -> ``plan``; execution lives in ``execute``.

``plan(sql, catalog, params)`` returns one of the plan nodes below; ``parameter_schema(sql, catalog)``
types the statement's placeholders for prepared statements.
"""

from flightstore.sql.nodes import (
                                   Changelog,
                                   Count,
                                   CreateDatabase,
                                   CreateTable,
                                   Delete,
                                   Describe,
                                   DropDatabase,
                                   DropTable,
                                   Explain,
                                   Grant,
                                   Insert,
                                   InsertSelect,
                                   Plan,
                                   PlanNode,
                                   PointLookup,
                                   PrefixLookup,
                                   RangeScan,
                                   Residual,
                                   ResidualInput,
                                   Revoke,
                                   Scan,
                                   ShowDatabases,
                                   ShowGrants,
                                   ShowTables,
                                   Update,
                                   UseDatabase,
)
from flightstore.sql.plan import CatalogView, parameter_schema, plan

__all__ = [
    "plan", "parameter_schema", "CatalogView", "Plan", "PlanNode", "PointLookup", "PrefixLookup",
    "Scan", "RangeScan", "Count", "Changelog", "Residual", "ResidualInput", "Insert", "InsertSelect",
    "Delete", "Update", "CreateDatabase", "DropDatabase", "CreateTable", "DropTable", "ShowDatabases",
    "ShowTables", "Describe", "Explain", "UseDatabase", "Grant", "Revoke", "ShowGrants",
]
