"""Planning of DDL and metadata statements in the Flink SQL form Fluss users write.

``CREATE DATABASE [IF NOT EXISTS] db``, ``DROP DATABASE [IF EXISTS] db [CASCADE]``,
``CREATE TABLE [IF NOT EXISTS] [db.]t (col TYPE [NOT NULL] [COMMENT '..'], ...,
PRIMARY KEY (..) NOT ENFORCED) [COMMENT '..'] [PARTITIONED BY (..)] [WITH ('k' = 'v', ...)]``,
``DROP TABLE [IF EXISTS] t``, ``SHOW DATABASES``, ``SHOW TABLES [IN|FROM db]``, ``DESCRIBE t``,
``USE db``. Table validation is :meth:`TableDescriptor.create`'s; its InvalidInput errors propagate.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from flightstore.errors import DatabaseNotFound, InvalidInput, SqlError, TableNotFound, Unsupported
from flightstore.names import check_name
from flightstore.schema import TableDescriptor, TablePath
from flightstore.sql.literals import NotALiteral, datatype_to_arrow, literal_value
from flightstore.sql.nodes import (
    CreateDatabase,
    CreateTable,
    Describe,
    DropDatabase,
    DropTable,
    Plan,
    ShowDatabases,
    ShowTables,
    UseDatabase,
)
from flightstore.sql.parse import Show
from flightstore.sql.resolve import CatalogView, resolve_database, resolve_table_node

__all__ = ["TEMPORARY_REFUSED", "plan_show", "plan_ddl", "statement_kind", "column_field"]

# Refused rather than half done: a "temporary" table every connection saw and that outlived its
# session would be a permanent table under a name a client believes private.
TEMPORARY_REFUSED = ("temporary tables are not supported: flightstore has no session-scoped tables, and a "
                     "table it created would be seen by every connection and outlive the session; create a "
                     "regular table (and DROP TABLE it when done)")


def statement_kind(statement: exp.Expression) -> str:
    """A readable name of a statement kind (``ALTER TABLE``, ``GRANT``, ``CREATE VIEW``)."""
    kind = statement.args.get("kind")
    name = {"truncatetable": "TRUNCATE", "altercolumn": "ALTER"}.get(statement.key,
                                                                     statement.key.upper())
    if isinstance(kind, str) and kind:
        return f"{name} {kind.upper()}"
    return name


def plan_show(statement: Show, catalog: CatalogView) -> Plan:
    if statement.what == "databases":
        return ShowDatabases()
    return ShowTables(database=resolve_database(catalog, statement.database
                                                or catalog.default_database))


def plan_ddl(statement: exp.Expression, catalog: CatalogView) -> Plan:
    """Plan CREATE / DROP / USE / DESCRIBE; any other statement is Unsupported, named."""
    if isinstance(statement, exp.Create):
        kind = (statement.args.get("kind") or "").upper()
        if statement.args.get("replace"):
            raise Unsupported(f"CREATE OR REPLACE {kind} is not supported")
        if kind in ("DATABASE", "SCHEMA"):
            return CreateDatabase(name=_database_name(statement.this),
                                  if_not_exists=bool(statement.args.get("exists")))
        if kind == "TABLE":
            return _create_table(statement, catalog)
    if isinstance(statement, exp.Drop):
        return _drop(statement, catalog)
    if isinstance(statement, exp.Use):
        if statement.args.get("kind"):
            raise Unsupported(f"USE {statement.args['kind'].sql()} is not supported; use USE db")
        return UseDatabase(name=resolve_database(catalog, _database_name(statement.this)))
    if isinstance(statement, exp.Describe):
        if not isinstance(statement.this, exp.Table):
            raise Unsupported(f"DESCRIBE {statement.this.sql()!r} is not supported; use DESCRIBE t")
        table = resolve_table_node(catalog, statement.this)
        if table.source != "table":
            raise SqlError(f"DESCRIBE works on tables; {statement.this.sql()} is a log view")
        return Describe(table=table.path)
    raise Unsupported(f"unsupported statement: {statement_kind(statement)}")


def _database_name(node: exp.Expression) -> str:
    if not isinstance(node, exp.Table) or node.db or not isinstance(node.this, exp.Identifier):
        raise SqlError(f"invalid database name {node.sql()!r}")
    return check_name(node.name, "database")


def _drop(statement: exp.Drop, catalog: CatalogView) -> Plan:
    kind = (statement.args.get("kind") or "").upper()
    targets = statement.args.get("tables") or [statement.this]
    if len(targets) != 1:
        raise Unsupported(f"DROP {kind} of several objects at once is not supported")
    target = targets[0]
    if_exists = bool(statement.args.get("exists"))
    if kind in ("DATABASE", "SCHEMA"):
        name = _database_name(target)
        try:
            name = resolve_database(catalog, name)
        except DatabaseNotFound:
            if not if_exists:
                raise
        return DropDatabase(name=name, if_exists=if_exists, cascade=bool(statement.args.get("cascade")))
    if kind == "TABLE":
        if not isinstance(target, exp.Table):
            raise SqlError(f"invalid table name {target.sql()!r}")
        try:
            return DropTable(table=resolve_table_node(catalog, target).path, if_exists=if_exists)
        except TableNotFound:
            if not if_exists:
                raise
            return DropTable(table=TablePath(target.db or catalog.default_database, target.name),
                             if_exists=True)
    raise Unsupported(f"unsupported statement: DROP {kind}")


def _create_table(statement: exp.Create, catalog: CatalogView) -> CreateTable:
    schema_node = statement.this
    if statement.args.get("expression") is not None:
        raise Unsupported("CREATE TABLE ... AS SELECT is not supported; create the table, then "
                          "INSERT INTO ... SELECT")
    if not isinstance(schema_node, exp.Schema) or not isinstance(schema_node.this, exp.Table):
        raise SqlError("CREATE TABLE needs a column list: CREATE TABLE t (col TYPE, ...)")
    table_node = schema_node.this
    check_name(table_node.name, "table")
    database = table_node.db or catalog.default_database
    try:
        database = resolve_database(catalog, database)
    except DatabaseNotFound:
        raise DatabaseNotFound(f"database {database!r} does not exist; CREATE DATABASE "
                               f"{database} first") from None
    path = TablePath(database, table_node.name)

    fields: list[pa.Field] = []
    primary_key: list[str] = []
    for item in schema_node.expressions:
        if isinstance(item, exp.ColumnDef):
            field, is_pk = column_field(item)
            fields.append(field)
            if is_pk:
                primary_key.append(field.name)
        elif isinstance(item, exp.PrimaryKey):
            if primary_key:
                raise SqlError(f"table {path}: the primary key is declared twice")
            primary_key = [_key_name(e) for e in item.expressions]
        else:
            raise Unsupported(f"table {path}: unsupported table element {item.sql()!r}")
    if not fields:
        raise SqlError(f"table {path}: CREATE TABLE needs at least one column")
    names = [f.name for f in fields]
    primary_key = [_match(names, c, path, "primary key") for c in primary_key]

    comment, partition_keys, options = "", [], {}
    properties = statement.args.get("properties")
    for prop in properties.expressions if properties else []:
        if isinstance(prop, exp.SchemaCommentProperty):
            comment = str(_option_value(prop.this, path))
        elif isinstance(prop, exp.PartitionedByProperty):
            columns = prop.this.expressions if isinstance(prop.this, exp.Schema) else [prop.this]
            partition_keys = [_match(names, _key_name(c), path, "partition key") for c in columns]
        elif isinstance(prop, exp.Property) and isinstance(prop.this, (exp.Literal, exp.Identifier,
                                                                          exp.Var, exp.Column)):
            key = prop.this.name if not isinstance(prop.this, exp.Literal) else prop.this.this
            options[str(key)] = _option_value(prop.args.get("value"), path)
        elif isinstance(prop, exp.TemporaryProperty):
            raise Unsupported(TEMPORARY_REFUSED)
        else:
            raise Unsupported(f"table {path}: unsupported table property {prop.sql()!r}; put "
                              "options in WITH ('key' = 'value')")
    descriptor = TableDescriptor.create(path, pa.schema(fields), primary_key=primary_key,
                                        partition_keys=partition_keys, options=options,
                                        comment=comment)
    return CreateTable(descriptor=descriptor, if_not_exists=bool(statement.args.get("exists")))


def _key_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Ordered):
        node = node.this
    if isinstance(node, (exp.Identifier, exp.Column)):
        return node.name
    raise SqlError(f"expected a column name, not {node.sql()!r}")


def _match(names: list[str], name: str, path: TablePath, what: str) -> str:
    if name in names:
        return name
    matches = [n for n in names if n.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    raise InvalidInput(f"table {path}: {what} column {name!r} is not a column")


def _option_value(node: exp.Expression | None, path: TablePath) -> str:
    try:
        value = literal_value(node) if node is not None else None
    except NotALiteral:
        raise SqlError(f"table {path}: option values must be literals, not {node.sql()!r}") from None
    if value is None:
        raise SqlError(f"table {path}: option values must not be NULL")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def column_field(node: exp.ColumnDef) -> tuple[pa.Field, bool]:
    """The Arrow field of a column definition, and whether it declares PRIMARY KEY."""
    name = node.name
    if not name or "$" in name:
        raise InvalidInput(f"invalid column name {name!r}")
    kind = node.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise Unsupported(f"column {name!r}: computed columns are not supported; give a type")
    arrow_type = datatype_to_arrow(kind)
    nullable, is_pk, metadata = True, False, {}
    for constraint in node.constraints:
        kind_node = constraint.args.get("kind")
        if isinstance(kind_node, exp.NotNullColumnConstraint):
            nullable = bool(kind_node.args.get("allow_null"))
        elif isinstance(kind_node, exp.PrimaryKeyColumnConstraint):
            is_pk = True
        elif isinstance(kind_node, exp.CommentColumnConstraint):
            metadata[b"comment"] = str(literal_value(kind_node.this)).encode()
        else:
            raise Unsupported(f"column {name!r}: unsupported column constraint {constraint.sql()!r}")
    return pa.field(name, arrow_type, nullable=nullable, metadata=metadata or None), is_pk
