"""The ``flightstore://`` SQLAlchemy dialect, on the ADBC Flight SQL driver.

Why ADBC and not flightsql-dbapi (the other Python Flight SQL DB-API, with its own dialect):
ADBC (``adbc-driver-flightsql``) is the Apache Arrow project's maintained driver; it reads every
endpoint of a FlightInfo, binds DATE / TIMESTAMP / DECIMAL parameters as Arrow types, sets Flight
session options (current schema) and runs on SQLAlchemy 1.4 (Superset) and 2.x alike.
flightsql-dbapi reads only a FlightInfo's first endpoint, pins ``sqlalchemy<2``, renders bound
``text()`` parameters as NULL in its default mode and has had no release since 2023.

URL: ``flightstore://[user:password@]host[:port][/database][?tls=true]``. The database, when
given, becomes the connection's current schema (the Flight session option ``schema``, what
``USE`` sets). Statements run in autocommit: flightstore has no transactions, so commit and
rollback do nothing.

Reflection asks the server in SQL (``SHOW DATABASES``, ``SHOW TABLES IN db``, ``DESCRIBE db.t``),
which answers the same on every SQLAlchemy version.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default
from sqlalchemy.sql import compiler

from flightstore_sqlalchemy.types import COLSPECS, FlightstoreTypeCompiler, type_from_sql

__all__ = ["FlightstoreDialect"]

DEFAULT_PORT = 8815


class FlightstoreIdentifierPreparer(compiler.IdentifierPreparer):
    """Double-quoted identifiers (the server also takes backticks); ``default`` is always quoted."""

    reserved_words = compiler.RESERVED_WORDS | {"default", "table", "partition", "comment"}


class FlightstoreCompiler(compiler.SQLCompiler):
    """SELECT/INSERT/... as flightstore parses them (generic ANSI SQL with LIMIT/OFFSET)."""


class FlightstoreDDLCompiler(compiler.DDLCompiler):
    """CREATE TABLE with ``PRIMARY KEY (...) NOT ENFORCED``, as Flink SQL writes it."""

    def visit_primary_key_constraint(self, constraint: Any, **kw: Any) -> str:
        text = super().visit_primary_key_constraint(constraint, **kw)
        return f"{text} NOT ENFORCED" if text else text

    def get_column_specification(self, column: Any, **kw: Any) -> str:
        spec = f"{self.preparer.format_column(column)} " \
               f"{self.dialect.type_compiler_instance.process(column.type, type_expression=column)}"
        if not column.nullable and not column.primary_key:
            spec += " NOT NULL"
        return spec


def _dbapi_connection(connection: Any) -> Any:
    """The ADBC DB-API connection under a SQLAlchemy connection (1.4 and 2.x spell it apart)."""
    raw = connection.connection
    return getattr(raw, "dbapi_connection", None) or getattr(raw, "connection", raw)


class FlightstoreDialect(default.DefaultDialect):
    """SQLAlchemy dialect ``flightstore`` over ``adbc_driver_flightsql.dbapi``."""

    name = "flightstore"
    driver = "adbc"
    paramstyle = "qmark"
    default_paramstyle = "qmark"
    positional = True
    supports_statement_cache = True
    supports_alter = False
    supports_sequences = False
    supports_native_boolean = True
    supports_native_decimal = True
    supports_multivalues_insert = True
    use_insertmanyvalues = False  # executemany: ADBC binds every row in one DoPut
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    supports_schemas = True
    supports_comments = False
    postfetch_lastrowid = False
    returns_native_bytes = True
    default_schema_name = "default"
    colspecs = COLSPECS
    preparer = FlightstoreIdentifierPreparer
    statement_compiler = FlightstoreCompiler
    ddl_compiler = FlightstoreDDLCompiler
    type_compiler = FlightstoreTypeCompiler
    type_compiler_cls = FlightstoreTypeCompiler

    # ---- the DB-API and connecting ------------------------------------------------------------
    @classmethod
    def import_dbapi(cls) -> Any:  # SQLAlchemy 2.x
        import adbc_driver_flightsql.dbapi as dbapi
        return dbapi

    @classmethod
    def dbapi(cls) -> Any:  # SQLAlchemy 1.4
        return cls.import_dbapi()

    def create_connect_args(self, url: Any) -> tuple[list, dict]:
        query = dict(url.query)
        tls = str(query.pop("tls", "false")).lower() in ("1", "true", "yes")
        uri = f"{'grpc+tls' if tls else 'grpc'}://{url.host or '127.0.0.1'}:{url.port or DEFAULT_PORT}"
        db_kwargs = {str(k): str(v) for k, v in query.items()}
        if url.username:
            db_kwargs["username"] = url.username
            db_kwargs["password"] = url.password or ""
        self._url_database = url.database or None
        return [uri], {"db_kwargs": db_kwargs, "autocommit": True}

    def on_connect(self) -> Any:
        database = getattr(self, "_url_database", None)
        if not database:
            return None

        def use(dbapi_connection: Any) -> None:
            dbapi_connection.adbc_current_db_schema = database
        return use

    def do_begin(self, dbapi_connection: Any) -> None:
        pass  # autocommit: flightstore has no transactions

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_ping(self, dbapi_connection: Any) -> bool:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        return True

    def _get_default_schema_name(self, connection: Any) -> str:
        return _dbapi_connection(connection).adbc_current_db_schema

    def _get_server_version_info(self, connection: Any) -> tuple:
        return ()

    # ---- reflection ---------------------------------------------------------------------------
    def _rows(self, connection: Any, sql: str) -> list[tuple]:
        return list(connection.exec_driver_sql(sql).fetchall())

    def _schema(self, connection: Any, schema: str | None) -> str:
        return schema or self._get_default_schema_name(connection)

    def _qualified(self, connection: Any, table_name: str, schema: str | None) -> str:
        quote = self.identifier_preparer.quote_identifier
        return f"{quote(self._schema(connection, schema))}.{quote(table_name)}"

    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        return [row[0] for row in self._rows(connection, "SHOW DATABASES")]

    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        quoted = self.identifier_preparer.quote_identifier(self._schema(connection, schema))
        return [row[0] for row in self._rows(connection, f"SHOW TABLES IN {quoted}")]

    def has_table(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> bool:
        if self._schema(connection, schema) not in self.get_schema_names(connection):
            return False
        return table_name in self.get_table_names(connection, schema)

    def _describe(self, connection: Any, table_name: str, schema: str | None) -> list[tuple]:
        from sqlalchemy.exc import NoSuchTableError
        if not self.has_table(connection, table_name, schema):
            raise NoSuchTableError(f"{self._schema(connection, schema)}.{table_name}")
        return self._rows(connection, f"DESCRIBE {self._qualified(connection, table_name, schema)}")

    def get_columns(self, connection: Any, table_name: str, schema: str | None = None,
                    **kw: Any) -> list[dict]:
        return [{"name": name, "type": type_from_sql(kind), "nullable": bool(nullable), "default": None,
                 "autoincrement": False, "comment": None}
                for name, kind, nullable, _key in self._describe(connection, table_name, schema)]

    def get_pk_constraint(self, connection: Any, table_name: str, schema: str | None = None,
                          **kw: Any) -> dict:
        rows = self._describe(connection, table_name, schema)
        return {"constrained_columns": [name for name, _t, _n, key in rows if key == "PRI"], "name": None}

    def get_foreign_keys(self, *args: Any, **kw: Any) -> list:
        return []

    def get_indexes(self, *args: Any, **kw: Any) -> list:
        return []

    def get_unique_constraints(self, *args: Any, **kw: Any) -> list:
        return []

    def get_check_constraints(self, *args: Any, **kw: Any) -> list:
        return []

    def get_view_names(self, *args: Any, **kw: Any) -> list:
        return []

    def get_table_comment(self, *args: Any, **kw: Any) -> dict:
        return {"text": None}


# Generic types SQLAlchemy hands a DB-API as Python values the ADBC driver binds as Arrow.
FlightstoreDialect.colspecs = {**COLSPECS, sqltypes.Numeric: sqltypes.Numeric}
