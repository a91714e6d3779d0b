"""GetSqlInfo: every SqlInfo id of the Flight SQL spec, answered with the spec's value type.

JDBC tools (DBeaver, Tableau) fetch all ids once and cache them; a missing id has crashed them, so
:data:`SQL_INFO` answers every id ``format/FlightSql.proto`` defines. The answers describe
flightstore: a SQL engine whose general queries run on DuckDB, no transactions, one catalog
(``flightstore``) whose schemas are flightstore databases.

The result is one row per id: ``info_name`` and a dense union whose member is chosen by the id's
:class:`InfoKind` (the union type code equals the kind's value).
"""

from __future__ import annotations

import enum
import importlib.metadata
from typing import Any, Sequence

import pyarrow as pa

__all__ = [
    "CATALOG_NAME", "SERVER_NAME", "SqlInfo", "InfoKind", "SQL_INFO", "SQL_INFO_KINDS",
    "SQL_INFO_SCHEMA", "sql_info_table", "SqlSupportsConvert", "KEYWORDS", "NUMERIC_FUNCTIONS",
    "STRING_FUNCTIONS", "SYSTEM_FUNCTIONS", "DATETIME_FUNCTIONS",
]

CATALOG_NAME = "flightstore"
SERVER_NAME = "flightstore"


class SqlInfo(enum.IntEnum):
    """The ``SqlInfo`` enum of FlightSql.proto (ids are the spec's)."""

    FLIGHT_SQL_SERVER_NAME = 0
    FLIGHT_SQL_SERVER_VERSION = 1
    FLIGHT_SQL_SERVER_ARROW_VERSION = 2
    FLIGHT_SQL_SERVER_READ_ONLY = 3
    FLIGHT_SQL_SERVER_SQL = 4
    FLIGHT_SQL_SERVER_SUBSTRAIT = 5
    FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION = 6
    FLIGHT_SQL_SERVER_SUBSTRAIT_MAX_VERSION = 7
    FLIGHT_SQL_SERVER_TRANSACTION = 8
    FLIGHT_SQL_SERVER_CANCEL = 9
    FLIGHT_SQL_SERVER_BULK_INGESTION = 10
    FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED = 11
    FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT = 100
    FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT = 101
    SQL_DDL_CATALOG = 500
    SQL_DDL_SCHEMA = 501
    SQL_DDL_TABLE = 502
    SQL_IDENTIFIER_CASE = 503
    SQL_IDENTIFIER_QUOTE_CHAR = 504
    SQL_QUOTED_IDENTIFIER_CASE = 505
    SQL_ALL_TABLES_ARE_SELECTABLE = 506
    SQL_NULL_ORDERING = 507
    SQL_KEYWORDS = 508
    SQL_NUMERIC_FUNCTIONS = 509
    SQL_STRING_FUNCTIONS = 510
    SQL_SYSTEM_FUNCTIONS = 511
    SQL_DATETIME_FUNCTIONS = 512
    SQL_SEARCH_STRING_ESCAPE = 513
    SQL_EXTRA_NAME_CHARACTERS = 514
    SQL_SUPPORTS_COLUMN_ALIASING = 515
    SQL_NULL_PLUS_NULL_IS_NULL = 516
    SQL_SUPPORTS_CONVERT = 517
    SQL_SUPPORTS_TABLE_CORRELATION_NAMES = 518
    SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES = 519
    SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY = 520
    SQL_SUPPORTS_ORDER_BY_UNRELATED = 521
    SQL_SUPPORTED_GROUP_BY = 522
    SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE = 523
    SQL_SUPPORTS_NON_NULLABLE_COLUMNS = 524
    SQL_SUPPORTED_GRAMMAR = 525
    SQL_ANSI92_SUPPORTED_LEVEL = 526
    SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY = 527
    SQL_OUTER_JOINS_SUPPORT_LEVEL = 528
    SQL_SCHEMA_TERM = 529
    SQL_PROCEDURE_TERM = 530
    SQL_CATALOG_TERM = 531
    SQL_CATALOG_AT_START = 532
    SQL_SCHEMAS_SUPPORTED_ACTIONS = 533
    SQL_CATALOGS_SUPPORTED_ACTIONS = 534
    SQL_SUPPORTED_POSITIONED_COMMANDS = 535
    SQL_SELECT_FOR_UPDATE_SUPPORTED = 536
    SQL_STORED_PROCEDURES_SUPPORTED = 537
    SQL_SUPPORTED_SUBQUERIES = 538
    SQL_CORRELATED_SUBQUERIES_SUPPORTED = 539
    SQL_SUPPORTED_UNIONS = 540
    SQL_MAX_BINARY_LITERAL_LENGTH = 541
    SQL_MAX_CHAR_LITERAL_LENGTH = 542
    SQL_MAX_COLUMN_NAME_LENGTH = 543
    SQL_MAX_COLUMNS_IN_GROUP_BY = 544
    SQL_MAX_COLUMNS_IN_INDEX = 545
    SQL_MAX_COLUMNS_IN_ORDER_BY = 546
    SQL_MAX_COLUMNS_IN_SELECT = 547
    SQL_MAX_COLUMNS_IN_TABLE = 548
    SQL_MAX_CONNECTIONS = 549
    SQL_MAX_CURSOR_NAME_LENGTH = 550
    SQL_MAX_INDEX_LENGTH = 551
    SQL_DB_SCHEMA_NAME_LENGTH = 552
    SQL_MAX_PROCEDURE_NAME_LENGTH = 553
    SQL_MAX_CATALOG_NAME_LENGTH = 554
    SQL_MAX_ROW_SIZE = 555
    SQL_MAX_ROW_SIZE_INCLUDES_BLOBS = 556
    SQL_MAX_STATEMENT_LENGTH = 557
    SQL_MAX_STATEMENTS = 558
    SQL_MAX_TABLE_NAME_LENGTH = 559
    SQL_MAX_TABLES_IN_SELECT = 560
    SQL_MAX_USERNAME_LENGTH = 561
    SQL_DEFAULT_TRANSACTION_ISOLATION = 562
    SQL_TRANSACTIONS_SUPPORTED = 563
    SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS = 564
    SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT = 565
    SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED = 566
    SQL_SUPPORTED_RESULT_SET_TYPES = 567
    SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_UNSPECIFIED = 568
    SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_FORWARD_ONLY = 569
    SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_SENSITIVE = 570
    SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_INSENSITIVE = 571
    SQL_BATCH_UPDATES_SUPPORTED = 572
    SQL_SAVEPOINTS_SUPPORTED = 573
    SQL_NAMED_PARAMETERS_SUPPORTED = 574
    SQL_LOCATORS_UPDATE_COPY = 575
    SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED = 576


class InfoKind(enum.IntEnum):
    """The dense-union member (and type code) that carries an id's value."""

    STRING = 0
    BOOL = 1
    BIGINT = 2
    INT32 = 3          # int32_bitmask: also used for the spec's int32 ordinals
    STRING_LIST = 4
    INT32_LIST_MAP = 5


class SqlSupportsConvert(enum.IntEnum):
    """The ``SqlSupportsConvert`` enum of FlightSql.proto (keys of SQL_SUPPORTS_CONVERT)."""

    BIGINT = 0
    BINARY = 1
    BIT = 2
    CHAR = 3
    DATE = 4
    DECIMAL = 5
    FLOAT = 6
    INTEGER = 7
    INTERVAL_DAY_TIME = 8
    INTERVAL_YEAR_MONTH = 9
    LONGVARBINARY = 10
    LONGVARCHAR = 11
    NUMERIC = 12
    REAL = 13
    SMALLINT = 14
    TIME = 15
    TIMESTAMP = 16
    TINYINT = 17
    VARBINARY = 18
    VARCHAR = 19


def _server_version() -> str:
    try:
        return importlib.metadata.version("flightstore")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0"


def _bits(*positions: int) -> int:
    """An int32 bitmask with the given enum ordinals set (the spec's bitmask encoding)."""
    mask = 0
    for position in positions:
        mask |= 1 << position
    return mask


def _convert_map() -> dict[int, list[int]]:
    """CAST support (DuckDB casts): numbers among themselves, everything to and from text."""
    c = SqlSupportsConvert
    numeric = [c.BIGINT, c.BIT, c.DECIMAL, c.FLOAT, c.INTEGER, c.NUMERIC, c.REAL, c.SMALLINT,
               c.TINYINT]
    text = [c.CHAR, c.LONGVARCHAR, c.VARCHAR]
    binary = [c.BINARY, c.LONGVARBINARY, c.VARBINARY]
    result: dict[int, list[int]] = {}
    for source in numeric:
        result[source] = numeric + text
    for source in text:
        result[source] = numeric + text + binary + [c.DATE, c.TIME, c.TIMESTAMP]
    for source in binary:
        result[source] = binary + text
    result[c.DATE] = [c.DATE, c.TIMESTAMP] + text
    result[c.TIME] = [c.TIME] + text
    result[c.TIMESTAMP] = [c.DATE, c.TIME, c.TIMESTAMP] + text
    return {int(k): sorted(int(v) for v in set(vs)) for k, vs in sorted(result.items())}


# Function names advertised for JDBC's get*Functions(); all callable in our SQL (DuckDB names).
NUMERIC_FUNCTIONS = ["ABS", "ACOS", "ASIN", "ATAN", "ATAN2", "CBRT", "CEIL", "CEILING", "COS",
                     "COT", "DEGREES", "EXP", "FLOOR", "GREATEST", "LEAST", "LN", "LOG", "LOG10",
                     "LOG2", "MOD", "PI", "POW", "POWER", "RADIANS", "RANDOM", "ROUND", "SIGN",
                     "SIN", "SQRT", "TAN", "TRUNC"]
STRING_FUNCTIONS = ["ASCII", "BIT_LENGTH", "CHR", "CONCAT", "CONCAT_WS", "CONTAINS", "ENDS_WITH",
                    "INSTR", "LCASE", "LEFT", "LENGTH", "LOWER", "LPAD", "LTRIM", "MD5",
                    "OCTET_LENGTH", "POSITION", "REGEXP_MATCHES", "REGEXP_REPLACE", "REPEAT",
                    "REPLACE", "REVERSE", "RIGHT", "RPAD", "RTRIM", "SPLIT_PART", "STARTS_WITH",
                    "STRPOS", "SUBSTR", "SUBSTRING", "TRIM", "UCASE", "UPPER"]
SYSTEM_FUNCTIONS = ["COALESCE", "CURRENT_DATABASE", "CURRENT_SCHEMA", "HASH", "IFNULL", "NULLIF",
                    "TYPEOF", "VERSION"]
# (flightstore/sql/dates.py reads each in the forms DuckDB, PostgreSQL, Flink and JDBC write it;
# tests/sql/test_dates.py calls every one.)
DATETIME_FUNCTIONS = ["AGE", "CURDATE", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "CURTIME",
                      "DATEADD", "DATEDIFF", "DATEPART", "DATE_ADD", "DATE_DIFF", "DATE_FORMAT", "DATE_PART",
                      "DATE_SUB", "DATE_TRUNC", "DAY", "DAYNAME", "DAYOFMONTH", "DAYOFWEEK", "DAYOFYEAR",
                      "EPOCH", "EPOCH_MS", "EXTRACT", "HOUR", "LAST_DAY", "LOCALTIME", "LOCALTIMESTAMP",
                      "MAKE_DATE", "MAKE_TIME", "MAKE_TIMESTAMP", "MINUTE", "MONTH", "MONTHNAME", "NOW",
                      "QUARTER", "SECOND", "STRFTIME", "STRPTIME", "TIMESTAMPADD", "TIMESTAMPDIFF", "TO_CHAR",
                      "TO_DATE", "TO_TIMESTAMP", "WEEK", "YEAR"]
# Keywords beyond SQL:2003 (what JDBC's getSQLKeywords asks for): flightstore's and DuckDB's.
KEYWORDS = ["ANTI", "ASOF", "BUCKET", "CHANGELOG", "DESCRIBE", "EXCLUDE", "GLOB", "ILIKE",
            "LIMIT", "OFFSET", "PARTITIONED", "PIVOT", "PRAGMA", "QUALIFY", "SEMI", "SHOW",
            "SUMMARIZE", "UNPIVOT"]

_S, _B, _L, _I = InfoKind.STRING, InfoKind.BOOL, InfoKind.BIGINT, InfoKind.INT32
_CASE_INSENSITIVE = 1          # SqlSupportedCaseSensitivity.SQL_CASE_SENSITIVITY_CASE_INSENSITIVE
_NULLS_SORTED_AT_END = 3       # SqlNullOrdering.SQL_NULLS_SORTED_AT_END (DuckDB: NULLS LAST)
_FULL_OUTER_JOINS = 2          # SqlOuterJoinsSupportLevel.SQL_FULL_OUTER_JOINS
_TRANSACTION_NONE = 0          # SqlTransactionIsolationLevel / SqlSupportedTransaction NONE
_FORWARD_ONLY = 1              # SqlSupportedResultSetType.SQL_RESULT_SET_TYPE_FORWARD_ONLY
_READ_ONLY = 1                 # SqlSupportedResultSetConcurrency.SQL_RESULT_SET_CONCURRENCY_READ_ONLY

_i = SqlInfo
_ROWS: list[tuple[SqlInfo, InfoKind, Any]] = [
    (_i.FLIGHT_SQL_SERVER_NAME, _S, SERVER_NAME),
    (_i.FLIGHT_SQL_SERVER_VERSION, _S, _server_version()),
    (_i.FLIGHT_SQL_SERVER_ARROW_VERSION, _S, pa.__version__),
    (_i.FLIGHT_SQL_SERVER_READ_ONLY, _B, False),
    (_i.FLIGHT_SQL_SERVER_SQL, _B, True),
    (_i.FLIGHT_SQL_SERVER_SUBSTRAIT, _B, False),
    (_i.FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION, _S, None),   # null: Substrait unsupported
    (_i.FLIGHT_SQL_SERVER_SUBSTRAIT_MAX_VERSION, _S, None),
    (_i.FLIGHT_SQL_SERVER_TRANSACTION, _I, _TRANSACTION_NONE),
    # Only about the deprecated CancelQuery action; CancelFlightInfo is a Flight core action.
    (_i.FLIGHT_SQL_SERVER_CANCEL, _B, False),
    (_i.FLIGHT_SQL_SERVER_BULK_INGESTION, _B, True),
    (_i.FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED, _B, False),
    (_i.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT, _I, 0),
    (_i.FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT, _I, 0),
    (_i.SQL_DDL_CATALOG, _B, False),
    (_i.SQL_DDL_SCHEMA, _B, True),                 # CREATE/DROP DATABASE
    (_i.SQL_DDL_TABLE, _B, True),
    (_i.SQL_IDENTIFIER_CASE, _I, _CASE_INSENSITIVE),
    (_i.SQL_IDENTIFIER_QUOTE_CHAR, _S, '"'),
    (_i.SQL_QUOTED_IDENTIFIER_CASE, _I, _CASE_INSENSITIVE),
    (_i.SQL_ALL_TABLES_ARE_SELECTABLE, _B, True),
    (_i.SQL_NULL_ORDERING, _I, _NULLS_SORTED_AT_END),
    (_i.SQL_KEYWORDS, InfoKind.STRING_LIST, KEYWORDS),
    (_i.SQL_NUMERIC_FUNCTIONS, InfoKind.STRING_LIST, NUMERIC_FUNCTIONS),
    (_i.SQL_STRING_FUNCTIONS, InfoKind.STRING_LIST, STRING_FUNCTIONS),
    (_i.SQL_SYSTEM_FUNCTIONS, InfoKind.STRING_LIST, SYSTEM_FUNCTIONS),
    (_i.SQL_DATETIME_FUNCTIONS, InfoKind.STRING_LIST, DATETIME_FUNCTIONS),
    (_i.SQL_SEARCH_STRING_ESCAPE, _S, "\\"),
    (_i.SQL_EXTRA_NAME_CHARACTERS, _S, ""),
    (_i.SQL_SUPPORTS_COLUMN_ALIASING, _B, True),
    (_i.SQL_NULL_PLUS_NULL_IS_NULL, _B, True),
    (_i.SQL_SUPPORTS_CONVERT, InfoKind.INT32_LIST_MAP, _convert_map()),
    (_i.SQL_SUPPORTS_TABLE_CORRELATION_NAMES, _B, True),
    (_i.SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES, _B, False),
    (_i.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY, _B, True),
    (_i.SQL_SUPPORTS_ORDER_BY_UNRELATED, _B, True),
    (_i.SQL_SUPPORTED_GROUP_BY, _I, _bits(0, 1)),        # UNRELATED, BEYOND_SELECT
    (_i.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE, _B, True),
    (_i.SQL_SUPPORTS_NON_NULLABLE_COLUMNS, _B, True),
    (_i.SQL_SUPPORTED_GRAMMAR, _I, _bits(0, 1)),         # MINIMUM, CORE
    (_i.SQL_ANSI92_SUPPORTED_LEVEL, _I, _bits(0, 1)),    # ENTRY, INTERMEDIATE
    (_i.SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY, _B, False),
    (_i.SQL_OUTER_JOINS_SUPPORT_LEVEL, _I, _FULL_OUTER_JOINS),
    (_i.SQL_SCHEMA_TERM, _S, "database"),
    (_i.SQL_PROCEDURE_TERM, _S, "procedure"),
    (_i.SQL_CATALOG_TERM, _S, "catalog"),
    (_i.SQL_CATALOG_AT_START, _B, True),
    (_i.SQL_SCHEMAS_SUPPORTED_ACTIONS, _I, 0),
    (_i.SQL_CATALOGS_SUPPORTED_ACTIONS, _I, 0),
    (_i.SQL_SUPPORTED_POSITIONED_COMMANDS, _I, 0),
    (_i.SQL_SELECT_FOR_UPDATE_SUPPORTED, _B, False),
    (_i.SQL_STORED_PROCEDURES_SUPPORTED, _B, False),
    (_i.SQL_SUPPORTED_SUBQUERIES, _I, _bits(0, 1, 2, 3)),  # comparisons, EXISTS, IN, quantified
    (_i.SQL_CORRELATED_SUBQUERIES_SUPPORTED, _B, True),
    (_i.SQL_SUPPORTED_UNIONS, _I, _bits(0, 1)),          # UNION, UNION ALL
    # int64 limits: 0 means "no limit or unknown" in the spec (and in JDBC).
    *((info, _L, 0) for info in SqlInfo if 541 <= info <= 555),
    (_i.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS, _B, False),
    *((info, _L, 0) for info in SqlInfo if 557 <= info <= 561),
    (_i.SQL_DEFAULT_TRANSACTION_ISOLATION, _I, _TRANSACTION_NONE),
    (_i.SQL_TRANSACTIONS_SUPPORTED, _B, False),
    (_i.SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS, _I, _bits(_TRANSACTION_NONE)),
    (_i.SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT, _B, False),
    (_i.SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED, _B, False),
    (_i.SQL_SUPPORTED_RESULT_SET_TYPES, _I, _bits(_FORWARD_ONLY)),
    (_i.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_UNSPECIFIED, _I, _bits(_READ_ONLY)),
    (_i.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_FORWARD_ONLY, _I, _bits(_READ_ONLY)),
    (_i.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_SENSITIVE, _I, 0),
    (_i.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_INSENSITIVE, _I, 0),
    (_i.SQL_BATCH_UPDATES_SUPPORTED, _B, True),
    (_i.SQL_SAVEPOINTS_SUPPORTED, _B, False),
    (_i.SQL_NAMED_PARAMETERS_SUPPORTED, _B, False),
    (_i.SQL_LOCATORS_UPDATE_COPY, _B, False),
    (_i.SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED, _B, False),
]

#: id -> Python value (str / bool / int / list[str] / dict[int, list[int]]; None = null string).
SQL_INFO: dict[int, Any] = {int(info): value for info, _, value in _ROWS}
#: id -> the union member that carries it.
SQL_INFO_KINDS: dict[int, InfoKind] = {int(info): kind for info, kind, _ in _ROWS}

_UNION_FIELDS = [
    pa.field("string_value", pa.utf8()),
    pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()),
    pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.field("string_data", pa.utf8()))),
    pa.field("int32_to_int32_list_map",
             pa.map_(pa.field("key", pa.int32(), nullable=False),
                     pa.field("value", pa.list_(pa.field("$data$", pa.int32()))))),
]
#: ``info_name: uint32 not null, value: dense_union<...>`` exactly as the spec's comment. The
#: union column is declared not null like the Java and Go reference servers (a union has no
#: validity bitmap of its own; nulls live in its members).
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False),
    pa.field("value", pa.dense_union(_UNION_FIELDS, type_codes=list(range(6))), nullable=False),
])


def sql_info_table(ids: Sequence[int] | None = None) -> pa.Table:
    """One row per requested id, in request order (all ids, ascending, when ``ids`` is empty).

    Unknown ids are skipped, as the spec lets servers answer only what they know; duplicates are
    answered once.
    """
    wanted = sorted(SQL_INFO) if not ids else list(dict.fromkeys(int(i) for i in ids))
    wanted = [i for i in wanted if i in SQL_INFO]
    children: list[list[Any]] = [[] for _ in InfoKind]
    type_ids: list[int] = []
    offsets: list[int] = []
    for info in wanted:
        kind = SQL_INFO_KINDS[info]
        value = SQL_INFO[info]
        if kind is InfoKind.INT32_LIST_MAP:
            value = list(value.items())
        type_ids.append(int(kind))
        offsets.append(len(children[kind]))
        children[kind].append(value)
    arrays = [pa.array(values, type=field.type) for values, field in zip(children, _UNION_FIELDS)]
    union = pa.UnionArray.from_dense(
        pa.array(type_ids, type=pa.int8()), pa.array(offsets, type=pa.int32()), arrays,
        [f.name for f in _UNION_FIELDS], list(range(6)))
    return pa.Table.from_arrays([pa.array(wanted, type=pa.uint32()), union], schema=SQL_INFO_SCHEMA)
