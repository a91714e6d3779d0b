"""Flight SQL catalog metadata: the spec's result schemas and pure functions that fill them.

Each ``Command*`` metadata request has a fixed Arrow result schema in ``format/FlightSql.proto``
(nullability included; ADBC compares FlightInfo and DoGet schemas strictly). The functions here
take plain data (database names, :class:`TableDescriptor` values) and return tables with exactly
those schemas, filtered by the request's LIKE patterns and ordered as the spec says. They do no
I/O: the service reads the catalog and passes what it found.

flightstore maps its model onto Flight SQL as: one catalog, ``flightstore``; each database is a
db_schema; every table has table_type ``TABLE``. GetSqlInfo lives in :mod:`.sql_info` and is
re-exported here.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import pyarrow as pa

from flightstore.schema import TableDescriptor, arrow_type_to_sql
from flightstore.server.sql_info import CATALOG_NAME, SQL_INFO, SQL_INFO_SCHEMA, sql_info_table

__all__ = [
    "CATALOG_NAME", "TABLE_TYPE", "PARTITION_KEYS_METADATA",
    "CATALOGS_SCHEMA", "DB_SCHEMAS_SCHEMA", "TABLES_SCHEMA", "TABLES_SCHEMA_WITH_SCHEMA",
    "TABLE_TYPES_SCHEMA", "PRIMARY_KEYS_SCHEMA", "IMPORTED_KEYS_SCHEMA", "EXPORTED_KEYS_SCHEMA",
    "CROSS_REFERENCE_SCHEMA", "XDBC_TYPE_INFO_SCHEMA", "SQL_INFO_SCHEMA", "SQL_INFO",
    "sql_info_table", "catalogs_table", "table_types_table", "db_schemas_table", "tables_table",
    "primary_keys_table", "xdbc_type_info_table", "with_column_metadata", "like_matches",
]

TABLE_TYPE = "TABLE"
PARTITION_KEYS_METADATA = b"flightstore.partition_keys"  # schema metadata of a partitioned table


def _utf8(name: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, pa.utf8(), nullable=nullable)


CATALOGS_SCHEMA = pa.schema([_utf8("catalog_name", False)])
DB_SCHEMAS_SCHEMA = pa.schema([_utf8("catalog_name"), _utf8("db_schema_name", False)])
TABLES_SCHEMA = pa.schema([_utf8("catalog_name"), _utf8("db_schema_name"),
                           _utf8("table_name", False), _utf8("table_type", False)])
TABLES_SCHEMA_WITH_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([_utf8("table_type", False)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    _utf8("catalog_name"), _utf8("db_schema_name"), _utf8("table_name", False),
    _utf8("column_name", False), _utf8("key_name"), pa.field("key_sequence", pa.int32(), False)])
IMPORTED_KEYS_SCHEMA = pa.schema([
    _utf8("pk_catalog_name"), _utf8("pk_db_schema_name"), _utf8("pk_table_name", False),
    _utf8("pk_column_name", False), _utf8("fk_catalog_name"), _utf8("fk_db_schema_name"),
    _utf8("fk_table_name", False), _utf8("fk_column_name", False),
    pa.field("key_sequence", pa.int32(), False), _utf8("fk_key_name"), _utf8("pk_key_name"),
    pa.field("update_rule", pa.uint8(), False), pa.field("delete_rule", pa.uint8(), False)])
EXPORTED_KEYS_SCHEMA = IMPORTED_KEYS_SCHEMA
CROSS_REFERENCE_SCHEMA = IMPORTED_KEYS_SCHEMA
XDBC_TYPE_INFO_SCHEMA = pa.schema([
    _utf8("type_name", False),
    pa.field("data_type", pa.int32(), False),
    pa.field("column_size", pa.int32()),
    _utf8("literal_prefix"),
    _utf8("literal_suffix"),
    pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
    pa.field("nullable", pa.int32(), False),
    pa.field("case_sensitive", pa.bool_(), False),
    pa.field("searchable", pa.int32(), False),
    pa.field("unsigned_attribute", pa.bool_()),
    pa.field("fixed_prec_scale", pa.bool_(), False),
    pa.field("auto_increment", pa.bool_()),
    _utf8("local_type_name"),
    pa.field("minimum_scale", pa.int32()),
    pa.field("maximum_scale", pa.int32()),
    pa.field("sql_data_type", pa.int32(), False),
    pa.field("datetime_subcode", pa.int32()),
    pa.field("num_prec_radix", pa.int32()),
    pa.field("interval_precision", pa.int32()),
])


# ---- LIKE patterns --------------------------------------------------------------------------
_LIKE_CACHE: dict[str, re.Pattern[str]] = {}


def like_matches(pattern: str | None, value: str) -> bool:
    """SQL LIKE as the spec's filter patterns use it: ``%`` any run, ``_`` one character.

    ``\\`` escapes a wildcard (the SQL_SEARCH_STRING_ESCAPE we advertise). Matching is
    case-sensitive and anchored. A ``None`` pattern matches everything.
    """
    if pattern is None:
        return True
    compiled = _LIKE_CACHE.get(pattern)
    if compiled is None:
        parts: list[str] = []
        chars = iter(pattern)
        for char in chars:
            if char == "\\":
                parts.append(re.escape(next(chars, "\\")))
            elif char == "%":
                parts.append(".*")
            elif char == "_":
                parts.append(".")
            else:
                parts.append(re.escape(char))
        compiled = _LIKE_CACHE[pattern] = re.compile("".join(parts), re.DOTALL)
    return compiled.fullmatch(value) is not None


def _catalog_matches(catalog: str | None) -> bool:
    """The spec: omitted -> no narrowing; ``""`` -> objects without a catalog (we have none)."""
    return catalog is None or catalog == CATALOG_NAME


# ---- simple listings ------------------------------------------------------------------------
def catalogs_table() -> pa.Table:
    """GetCatalogs: the single catalog ``flightstore``."""
    return pa.Table.from_pydict({"catalog_name": [CATALOG_NAME]}, schema=CATALOGS_SCHEMA)


def table_types_table() -> pa.Table:
    """GetTableTypes: ``TABLE`` (log and primary-key tables alike)."""
    return pa.Table.from_pydict({"table_type": [TABLE_TYPE]}, schema=TABLE_TYPES_SCHEMA)


def db_schemas_table(databases: Iterable[str], catalog: str | None = None,
                     pattern: str | None = None) -> pa.Table:
    """GetDbSchemas over the given database names, filtered and ordered by name."""
    names = sorted({d for d in databases if like_matches(pattern, d)}) if _catalog_matches(
        catalog) else []
    return pa.Table.from_pydict({"catalog_name": [CATALOG_NAME] * len(names),
                                 "db_schema_name": names}, schema=DB_SCHEMAS_SCHEMA)


def tables_table(descriptors: Iterable[TableDescriptor], *, catalog: str | None = None,
                 db_schema_filter_pattern: str | None = None,
                 table_name_filter_pattern: str | None = None,
                 table_types: Sequence[str] | None = None,
                 include_schema: bool = False) -> pa.Table:
    """GetTables over the given descriptors.

    Filters by catalog, LIKE patterns on database and table name, and table types (compared
    case-insensitively; empty means all). Ordered by catalog, db_schema, table name. With
    ``include_schema`` the ``table_schema`` column holds each table's IPC-serialized schema
    carrying the Flight SQL column metadata of :func:`with_column_metadata`.
    """
    wanted_types = {t.upper() for t in table_types or ()}
    selected = [] if not _catalog_matches(catalog) or (
        wanted_types and TABLE_TYPE not in wanted_types) else [
        d for d in descriptors
        if like_matches(db_schema_filter_pattern, d.path.database)
        and like_matches(table_name_filter_pattern, d.path.table)]
    selected.sort(key=lambda d: (d.path.database, d.path.table))
    columns: dict[str, list] = {
        "catalog_name": [CATALOG_NAME] * len(selected),
        "db_schema_name": [d.path.database for d in selected],
        "table_name": [d.path.table for d in selected],
        "table_type": [TABLE_TYPE] * len(selected),
    }
    if not include_schema:
        return pa.Table.from_pydict(columns, schema=TABLES_SCHEMA)
    columns["table_schema"] = [with_column_metadata(d.schema, d).serialize().to_pybytes()
                               for d in selected]
    return pa.Table.from_pydict(columns, schema=TABLES_SCHEMA_WITH_SCHEMA)


def primary_keys_table(descriptors: TableDescriptor | Iterable[TableDescriptor] | None) -> pa.Table:
    """GetPrimaryKeys: one row per primary-key column, ``key_sequence`` counting from 1.

    Takes the table(s) the request resolved to (several when db_schema was omitted); log tables
    contribute no rows. Ordered by catalog, db_schema, table name, key name, key sequence.
    """
    if descriptors is None:
        descriptors = []
    elif isinstance(descriptors, TableDescriptor):
        descriptors = [descriptors]
    rows = [(d.path.database, d.path.table, column, sequence)
            for d in sorted(descriptors, key=lambda d: (d.path.database, d.path.table))
            for sequence, column in enumerate(d.primary_key, start=1)]
    return pa.Table.from_pydict({
        "catalog_name": [CATALOG_NAME] * len(rows),
        "db_schema_name": [r[0] for r in rows],
        "table_name": [r[1] for r in rows],
        "column_name": [r[2] for r in rows],
        "key_name": [None] * len(rows),
        "key_sequence": [r[3] for r in rows],
    }, schema=PRIMARY_KEYS_SCHEMA)


# ---- column metadata ------------------------------------------------------------------------
_META = "ARROW:FLIGHT:SQL:"
_INT_PRECISION = {8: 3, 16: 5, 32: 10, 64: 19}


def _precision_scale(arrow_type: pa.DataType) -> tuple[int | None, int | None]:
    """JDBC COLUMN_SIZE / DECIMAL_DIGITS of a type, where they mean something."""
    if pa.types.is_decimal(arrow_type):
        return arrow_type.precision, arrow_type.scale
    if pa.types.is_integer(arrow_type):
        return _INT_PRECISION[arrow_type.bit_width], 0
    if pa.types.is_float32(arrow_type):
        return 7, None
    if pa.types.is_float64(arrow_type):
        return 15, None
    if pa.types.is_timestamp(arrow_type) or pa.types.is_time(arrow_type):
        digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[arrow_type.unit]
        base = 19 if pa.types.is_timestamp(arrow_type) else 8   # "YYYY-MM-DD hh:mm:ss" / "hh:mm:ss"
        return base + (digits + 1 if digits else 0), digits
    if pa.types.is_date(arrow_type):
        return 10, None
    return None, None


def with_column_metadata(schema: pa.Schema, descriptor: TableDescriptor) -> pa.Schema:
    """``schema`` with the Flight SQL column metadata keys on every field (JDBC getColumns).

    Sets CATALOG_NAME, DB_SCHEMA_NAME (and SCHEMA_NAME), TABLE_NAME, TYPE_NAME (our SQL type name without its
    parameters, matching :func:`xdbc_type_info_table`), PRECISION and
    SCALE where meaningful, IS_AUTO_INCREMENT ("0"), IS_CASE_SENSITIVE ("1" for text),
    IS_READ_ONLY ("0"), IS_SEARCHABLE ("1") and REMARKS ("partition key" on partition columns, and
    the column's COMMENT). Existing field metadata is kept; schema-level metadata is preserved,
    and a partitioned table's carries ``flightstore.partition_keys`` (comma-separated).
    """
    fields = []
    for field in schema:
        arrow_type = field.type
        text = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
        meta = {
            "CATALOG_NAME": CATALOG_NAME,
            "DB_SCHEMA_NAME": descriptor.path.database,
            # The spec's comment says DB_SCHEMA_NAME; the Java (JDBC), C++ and Go libraries read
            # SCHEMA_NAME. Send both.
            "SCHEMA_NAME": descriptor.path.database,
            "TABLE_NAME": descriptor.path.table,
            "TYPE_NAME": arrow_type_to_sql(arrow_type).split("(")[0],  # as GetXdbcTypeInfo names it
            "IS_AUTO_INCREMENT": "0",
            "IS_CASE_SENSITIVE": "1" if text else "0",
            "IS_READ_ONLY": "0",
            "IS_SEARCHABLE": "1",
        }
        remarks = [r for r in (
            "partition key" if field.name in descriptor.partition_keys else None,
            (field.metadata or {}).get(b"comment", b"").decode() or None) if r]
        if remarks:
            meta["REMARKS"] = "; ".join(remarks)
        precision, scale = _precision_scale(arrow_type)
        if precision is not None:
            meta["PRECISION"] = str(precision)
        if scale is not None:
            meta["SCALE"] = str(scale)
        merged = dict(field.metadata or {})
        merged.update({(_META + k).encode(): v.encode() for k, v in meta.items()})
        fields.append(field.with_metadata(merged))
    table_meta = dict(schema.metadata or {})
    if descriptor.partition_keys:
        table_meta[PARTITION_KEYS_METADATA] = ",".join(descriptor.partition_keys).encode()
    return pa.schema(fields, metadata=table_meta or None)


# ---- XDBC type info -------------------------------------------------------------------------
# XdbcDataType codes (JDBC java.sql.Types values) and XdbcDatetimeSubcode values from the spec.
_BIT, _TINYINT, _SMALLINT, _INTEGER, _BIGINT = -7, -6, 5, 4, -5
_REAL, _DOUBLE, _DECIMAL, _VARCHAR, _VARBINARY = 7, 8, 3, 12, -3
_DATE, _TIME, _TIMESTAMP, _DATETIME = 91, 92, 93, 9
_SEARCHABLE_BASIC, _SEARCHABLE_FULL = 2, 3
_NULLABLE = 1

# (type_name, data_type, column_size, prefix, suffix, create_params, case_sensitive, searchable,
#  unsigned, fixed_prec_scale, min_scale, max_scale, sql_data_type, datetime_subcode, radix)
_XDBC_TYPES = [
    ("BOOLEAN", _BIT, 1, None, None, None, False, _SEARCHABLE_BASIC, None, False, None, None,
     _BIT, None, None),
    ("TINYINT", _TINYINT, 3, None, None, None, False, _SEARCHABLE_BASIC, False, True, 0, 0,
     _TINYINT, None, 10),
    ("SMALLINT", _SMALLINT, 5, None, None, None, False, _SEARCHABLE_BASIC, False, True, 0, 0,
     _SMALLINT, None, 10),
    ("INT", _INTEGER, 10, None, None, None, False, _SEARCHABLE_BASIC, False, True, 0, 0,
     _INTEGER, None, 10),
    ("BIGINT", _BIGINT, 19, None, None, None, False, _SEARCHABLE_BASIC, False, True, 0, 0,
     _BIGINT, None, 10),
    ("FLOAT", _REAL, 24, None, None, None, False, _SEARCHABLE_BASIC, False, False, None, None,
     _REAL, None, 2),
    ("DOUBLE", _DOUBLE, 53, None, None, None, False, _SEARCHABLE_BASIC, False, False, None, None,
     _DOUBLE, None, 2),
    ("DECIMAL", _DECIMAL, 38, None, None, ["precision", "scale"], False, _SEARCHABLE_BASIC, False,
     False, 0, 38, _DECIMAL, None, 10),
    ("STRING", _VARCHAR, None, "'", "'", None, True, _SEARCHABLE_FULL, None, False, None, None,
     _VARCHAR, None, None),
    ("VARCHAR", _VARCHAR, None, "'", "'", ["length"], True, _SEARCHABLE_FULL, None, False, None,
     None, _VARCHAR, None, None),
    ("BYTES", _VARBINARY, None, "X'", "'", None, False, _SEARCHABLE_BASIC, None, False, None,
     None, _VARBINARY, None, None),
    ("DATE", _DATE, 10, "DATE '", "'", None, False, _SEARCHABLE_BASIC, None, False, None, None,
     _DATETIME, 1, None),
    ("TIME", _TIME, 15, "TIME '", "'", None, False, _SEARCHABLE_BASIC, None, False, 0, 6,
     _DATETIME, 2, None),
    ("TIMESTAMP", _TIMESTAMP, 29, "TIMESTAMP '", "'", ["precision"], False, _SEARCHABLE_BASIC,
     None, False, 0, 9, _DATETIME, 3, None),
    ("TIMESTAMP_LTZ", _TIMESTAMP, 29, "TIMESTAMP '", "'", ["precision"], False, _SEARCHABLE_BASIC,
     None, False, 0, 9, _DATETIME, 5, None),
]


def xdbc_type_info_table(data_type: int | None = None) -> pa.Table:
    """GetXdbcTypeInfo: our SQL types with their XDBC codes, ordered by data_type then name.

    With ``data_type`` only the types of that XDBC code are listed (possibly none).
    """
    rows = sorted((r for r in _XDBC_TYPES if data_type is None or r[1] == data_type),
                  key=lambda r: (r[1], r[0]))
    columns = {
        "type_name": [r[0] for r in rows],
        "data_type": [r[1] for r in rows],
        "column_size": [r[2] for r in rows],
        "literal_prefix": [r[3] for r in rows],
        "literal_suffix": [r[4] for r in rows],
        "create_params": [r[5] for r in rows],
        "nullable": [_NULLABLE] * len(rows),
        "case_sensitive": [r[6] for r in rows],
        "searchable": [r[7] for r in rows],
        "unsigned_attribute": [r[8] for r in rows],
        "fixed_prec_scale": [r[9] for r in rows],
        "auto_increment": [False if r[14] is not None else None for r in rows],
        "local_type_name": [r[0] for r in rows],
        "minimum_scale": [r[10] for r in rows],
        "maximum_scale": [r[11] for r in rows],
        "sql_data_type": [r[12] for r in rows],
        "datetime_subcode": [r[13] for r in rows],
        "num_prec_radix": [r[14] for r in rows],
        "interval_precision": [None] * len(rows),
    }
    return pa.Table.from_pydict(columns, schema=XDBC_TYPE_INFO_SCHEMA)
