"""Flight SQL metadata: spec schemas, GetSqlInfo, LIKE filtering, table schemas, XDBC types."""

from __future__ import annotations

import warnings

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_flightsql import dbapi

from flightstore.schema import TableDescriptor
from flightstore.server import metadata, protocol, sql_info
from flightstore.server.sql_info import InfoKind, SqlInfo
from flightstore.sql import dates


def _columns(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    return [(f.name, str(f.type), f.nullable) for f in schema]


# ---- the result schemas, transcribed from the comments of format/FlightSql.proto -------------
def test_simple_listing_schemas_match_the_spec() -> None:
    assert _columns(metadata.CATALOGS_SCHEMA) == [("catalog_name", "string", False)]
    assert _columns(metadata.DB_SCHEMAS_SCHEMA) == [
        ("catalog_name", "string", True), ("db_schema_name", "string", False)]
    assert _columns(metadata.TABLES_SCHEMA) == [
        ("catalog_name", "string", True), ("db_schema_name", "string", True),
        ("table_name", "string", False), ("table_type", "string", False)]
    assert _columns(metadata.TABLES_SCHEMA_WITH_SCHEMA) == _columns(metadata.TABLES_SCHEMA) + [
        ("table_schema", "binary", False)]
    assert _columns(metadata.TABLE_TYPES_SCHEMA) == [("table_type", "string", False)]
    assert _columns(metadata.PRIMARY_KEYS_SCHEMA) == [
        ("catalog_name", "string", True), ("db_schema_name", "string", True),
        ("table_name", "string", False), ("column_name", "string", False),
        ("key_name", "string", True), ("key_sequence", "int32", False)]


def test_foreign_key_schemas_match_the_spec() -> None:
    expected = [
        ("pk_catalog_name", "string", True), ("pk_db_schema_name", "string", True),
        ("pk_table_name", "string", False), ("pk_column_name", "string", False),
        ("fk_catalog_name", "string", True), ("fk_db_schema_name", "string", True),
        ("fk_table_name", "string", False), ("fk_column_name", "string", False),
        ("key_sequence", "int32", False), ("fk_key_name", "string", True),
        ("pk_key_name", "string", True), ("update_rule", "uint8", False),
        ("delete_rule", "uint8", False)]
    for schema in (metadata.IMPORTED_KEYS_SCHEMA, metadata.EXPORTED_KEYS_SCHEMA,
                   metadata.CROSS_REFERENCE_SCHEMA):
        assert _columns(schema) == expected


def test_xdbc_type_info_schema_matches_the_spec() -> None:
    assert _columns(metadata.XDBC_TYPE_INFO_SCHEMA) == [
        ("type_name", "string", False), ("data_type", "int32", False),
        ("column_size", "int32", True), ("literal_prefix", "string", True),
        ("literal_suffix", "string", True), ("create_params", "list<item: string not null>", True),
        ("nullable", "int32", False), ("case_sensitive", "bool", False),
        ("searchable", "int32", False), ("unsigned_attribute", "bool", True),
        ("fixed_prec_scale", "bool", False), ("auto_increment", "bool", True),
        ("local_type_name", "string", True), ("minimum_scale", "int32", True),
        ("maximum_scale", "int32", True), ("sql_data_type", "int32", False),
        ("datetime_subcode", "int32", True), ("num_prec_radix", "int32", True),
        ("interval_precision", "int32", True)]


def test_sql_info_schema_matches_the_spec() -> None:
    schema = metadata.SQL_INFO_SCHEMA
    assert schema.field("info_name").type == pa.uint32()
    assert not schema.field("info_name").nullable
    union = schema.field("value").type
    assert union.mode == "dense"
    assert list(union.type_codes) == [0, 1, 2, 3, 4, 5]
    assert [(f.name, str(f.type)) for f in union] == [
        ("string_value", "string"), ("bool_value", "bool"), ("bigint_value", "int64"),
        ("int32_bitmask", "int32"), ("string_list", "list<string_data: string>"),
        ("int32_to_int32_list_map", "map<int32, list<$data$: int32>>")]
    map_type = union.field(5).type
    assert not map_type.key_field.nullable


# ---- GetSqlInfo -----------------------------------------------------------------------------
def test_every_spec_id_is_answered() -> None:
    assert set(metadata.SQL_INFO) == {int(i) for i in SqlInfo}
    assert set(sql_info.SQL_INFO_KINDS) == set(metadata.SQL_INFO)
    assert min(SqlInfo) == 0 and max(SqlInfo) == 576
    assert {i for i in SqlInfo if i >= 500} == set(range(500, 577))  # no gap in the syntax range
    table = metadata.sql_info_table(None)
    assert table.schema.equals(metadata.SQL_INFO_SCHEMA)
    assert sorted(table.column("info_name").to_pylist()) == sorted(int(i) for i in SqlInfo)
    assert metadata.sql_info_table([]).num_rows == table.num_rows


def test_values_decode_from_the_dense_union() -> None:
    ids = [SqlInfo.FLIGHT_SQL_SERVER_NAME, SqlInfo.FLIGHT_SQL_SERVER_READ_ONLY,
           SqlInfo.FLIGHT_SQL_SERVER_TRANSACTION, SqlInfo.SQL_IDENTIFIER_QUOTE_CHAR,
           SqlInfo.SQL_MAX_COLUMNS_IN_TABLE, SqlInfo.SQL_NUMERIC_FUNCTIONS,
           SqlInfo.SQL_SUPPORTS_CONVERT, SqlInfo.FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION, 99999]
    table = metadata.sql_info_table(ids)
    assert table.column("info_name").to_pylist() == [int(i) for i in ids[:-1]]  # 99999 skipped
    value = table.column("value").combine_chunks()
    assert value.type_codes.to_pylist() == [0, 1, 3, 0, 2, 4, 5, 0]
    decoded = dict(zip(table.column("info_name").to_pylist(), value.to_pylist()))
    assert decoded[0] == "flightstore"
    assert decoded[3] is False
    assert decoded[8] == 0                  # SQL_SUPPORTED_TRANSACTION_NONE
    assert decoded[504] == '"'
    assert decoded[548] == 0
    assert "ABS" in decoded[509]
    convert = dict(decoded[517])
    assert sql_info.SqlSupportsConvert.VARCHAR in convert[sql_info.SqlSupportsConvert.INTEGER]
    assert decoded[6] is None


def test_value_types_follow_the_spec() -> None:
    kinds = sql_info.SQL_INFO_KINDS
    assert all(kinds[i] is InfoKind.BIGINT for i in range(541, 556))
    assert all(kinds[i] is InfoKind.BIGINT for i in range(557, 562))
    assert kinds[SqlInfo.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS] is InfoKind.BOOL
    assert all(kinds[i] is InfoKind.STRING_LIST for i in range(508, 513))
    for ordinal in (503, 505, 507, 522, 525, 526, 528, 533, 534, 535, 538, 540, 562, 564,
                    567, 568, 569, 570, 571, 8, 100, 101):
        assert kinds[ordinal] is InfoKind.INT32, ordinal
    for info, kind in kinds.items():
        value = metadata.SQL_INFO[info]
        expected = {InfoKind.STRING: (str, type(None)), InfoKind.BOOL: bool,
                    InfoKind.BIGINT: int, InfoKind.INT32: int, InfoKind.STRING_LIST: list,
                    InfoKind.INT32_LIST_MAP: dict}[kind]
        assert isinstance(value, expected), info


def test_sql_info_survives_an_ipc_stream() -> None:
    table = metadata.sql_info_table(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert pa.ipc.open_stream(sink.getvalue()).read_all().equals(table)


def test_advertised_functions_run_on_duckdb() -> None:
    con = duckdb.connect()
    known = {r[0].upper() for r in con.execute("SELECT function_name FROM duckdb_functions()").fetchall()}
    special_forms = {"COALESCE", "IFNULL", "CURRENT_TIME", "CURRENT_TIMESTAMP", "EXTRACT", "LOCALTIME",
                     "LOCALTIMESTAMP"}
    special_forms |= set(dates.FUNCTIONS)  # flightstore rewrites these (tests/sql/test_dates.py runs each)
    for info in (509, 510, 511, 512):
        missing = set(metadata.SQL_INFO[info]) - known - special_forms
        assert not missing, (info, missing)


# ---- listings and LIKE ----------------------------------------------------------------------
@pytest.mark.parametrize("pattern,value,expected", [
    ("%", "", True), ("o%", "orders", True), ("%ers", "orders", True), ("o_ders", "orders", True),
    ("o_ders", "oders", False), ("ORDERS", "orders", False), ("ord", "orders", False),
    ("a\\_b", "a_b", True), ("a\\_b", "axb", False), ("a\\%", "a%", True), ("a.b", "axb", False),
    (None, "anything", True),
])
def test_like_matches(pattern: str | None, value: str, expected: bool) -> None:
    assert metadata.like_matches(pattern, value) is expected


def test_catalogs_and_table_types() -> None:
    assert metadata.catalogs_table().to_pylist() == [{"catalog_name": "flightstore"}]
    assert metadata.catalogs_table().schema.equals(metadata.CATALOGS_SCHEMA)
    assert metadata.table_types_table().to_pylist() == [{"table_type": "TABLE"}]


def test_db_schemas_filter_and_order() -> None:
    dbs = ["sales", "default", "sandbox", "ops"]
    table = metadata.db_schemas_table(dbs, None, "sa%")
    assert table.schema.equals(metadata.DB_SCHEMAS_SCHEMA)
    assert table.column("db_schema_name").to_pylist() == ["sales", "sandbox"]
    assert metadata.db_schemas_table(dbs).column("db_schema_name").to_pylist() == sorted(dbs)
    assert metadata.db_schemas_table(dbs, "flightstore").num_rows == 4
    assert metadata.db_schemas_table(dbs, "").num_rows == 0          # "" = without a catalog
    assert metadata.db_schemas_table(dbs, "other").num_rows == 0


@pytest.fixture
def descriptors() -> list[TableDescriptor]:
    orders = TableDescriptor.create(
        "shop.orders",
        pa.schema([pa.field("id", pa.int64()), pa.field("customer", pa.string()),
                   pa.field("amount", pa.decimal128(10, 2)), pa.field("at", pa.timestamp("ms", "UTC"))]),
        primary_key=["customer", "id"], options={"bucket.key": "customer"})
    return [
        TableDescriptor.create("shop.returns", pa.schema([("id", pa.int64())])),
        orders,
        TableDescriptor.create("audit.events", pa.schema([("payload", pa.binary())])),
    ]


def test_tables_filter_and_order(descriptors: list[TableDescriptor]) -> None:
    table = metadata.tables_table(descriptors)
    assert table.schema.equals(metadata.TABLES_SCHEMA)
    assert [(r["db_schema_name"], r["table_name"]) for r in table.to_pylist()] == [
        ("audit", "events"), ("shop", "orders"), ("shop", "returns")]
    assert set(table.column("catalog_name").to_pylist()) == {"flightstore"}
    names = metadata.tables_table(descriptors, db_schema_filter_pattern="sh_p",
                                  table_name_filter_pattern="%s").column("table_name")
    assert names.to_pylist() == ["orders", "returns"]
    assert metadata.tables_table(descriptors, table_types=["table"]).num_rows == 3
    assert metadata.tables_table(descriptors, table_types=["VIEW"]).num_rows == 0
    assert metadata.tables_table(descriptors, catalog="nope").num_rows == 0
    assert metadata.tables_table(descriptors, catalog="flightstore").num_rows == 3


def test_tables_include_schema_round_trips(descriptors: list[TableDescriptor]) -> None:
    table = metadata.tables_table(descriptors, table_name_filter_pattern="orders",
                                  include_schema=True)
    assert table.schema.equals(metadata.TABLES_SCHEMA_WITH_SCHEMA)
    orders = descriptors[1]
    schema = pa.ipc.read_schema(pa.py_buffer(table.column("table_schema")[0].as_py()))
    expected = metadata.with_column_metadata(orders.schema, orders)
    assert schema.equals(expected, check_metadata=True)
    assert schema.names == orders.schema.names
    assert [f.nullable for f in schema] == [f.nullable for f in orders.schema]
    meta = {k.decode(): v.decode() for k, v in schema.field("amount").metadata.items()}
    assert meta["ARROW:FLIGHT:SQL:CATALOG_NAME"] == "flightstore"
    assert meta["ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"] == "shop"
    assert meta["ARROW:FLIGHT:SQL:SCHEMA_NAME"] == "shop"       # what JDBC/Go actually read
    assert meta["ARROW:FLIGHT:SQL:TABLE_NAME"] == "orders"
    assert meta["ARROW:FLIGHT:SQL:TYPE_NAME"] == "DECIMAL"
    assert (meta["ARROW:FLIGHT:SQL:PRECISION"], meta["ARROW:FLIGHT:SQL:SCALE"]) == ("10", "2")
    assert meta["ARROW:FLIGHT:SQL:IS_READ_ONLY"] == "0"
    text = schema.field("customer").metadata
    assert text[b"ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE"] == b"1"
    assert text[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"STRING"
    assert schema.field("at").metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"TIMESTAMP_LTZ"


def test_with_column_metadata_keeps_existing_metadata() -> None:
    descriptor = TableDescriptor.create("d.t", pa.schema([pa.field("a", pa.int32(),
                                                                   metadata={"k": "v"})]))
    field = metadata.with_column_metadata(descriptor.schema, descriptor).field("a")
    assert field.metadata[b"k"] == b"v"
    assert field.metadata[b"ARROW:FLIGHT:SQL:PRECISION"] == b"10"


def test_primary_keys(descriptors: list[TableDescriptor]) -> None:
    table = metadata.primary_keys_table(descriptors[1])
    assert table.schema.equals(metadata.PRIMARY_KEYS_SCHEMA)
    assert [(r["column_name"], r["key_sequence"]) for r in table.to_pylist()] == [
        ("customer", 1), ("id", 2)]
    assert table.column("table_name").to_pylist() == ["orders", "orders"]
    assert metadata.primary_keys_table(descriptors[0]).num_rows == 0   # log table
    assert metadata.primary_keys_table(descriptors).num_rows == 2
    assert metadata.primary_keys_table(None).schema.equals(metadata.PRIMARY_KEYS_SCHEMA)


# ---- XDBC type info -------------------------------------------------------------------------
def test_xdbc_type_info_lists_our_types_in_order() -> None:
    table = metadata.xdbc_type_info_table(None)
    assert table.schema.equals(metadata.XDBC_TYPE_INFO_SCHEMA)
    rows = table.to_pylist()
    by_name = {r["type_name"]: r for r in rows}
    assert set(by_name) >= {"BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE",
                            "DECIMAL", "STRING", "VARCHAR", "BYTES", "DATE", "TIME", "TIMESTAMP",
                            "TIMESTAMP_LTZ"}
    assert [(r["data_type"], r["type_name"]) for r in rows] == sorted(
        (r["data_type"], r["type_name"]) for r in rows)
    assert by_name["BIGINT"]["data_type"] == -5
    assert by_name["INT"]["data_type"] == 4
    assert by_name["STRING"]["data_type"] == 12
    assert by_name["DATE"]["sql_data_type"] == 9 and by_name["DATE"]["datetime_subcode"] == 1
    assert by_name["TIMESTAMP_LTZ"]["datetime_subcode"] == 5


def test_xdbc_type_info_filter() -> None:
    timestamps = metadata.xdbc_type_info_table(93)
    assert timestamps.column("type_name").to_pylist() == ["TIMESTAMP", "TIMESTAMP_LTZ"]
    assert metadata.xdbc_type_info_table(-5).column("type_name").to_pylist() == ["BIGINT"]
    empty = metadata.xdbc_type_info_table(2)   # XDBC_NUMERIC: none of ours
    assert empty.num_rows == 0 and empty.schema.equals(metadata.XDBC_TYPE_INFO_SCHEMA)


# ---- a real client reads these answers: adbc_driver_flightsql -------------------------------
class _NoAuth(flight.ServerAuthHandler):
    def authenticate(self, outgoing, incoming):  # noqa: ANN001
        pass

    def is_valid(self, token):  # noqa: ANN001
        return b""


class _MetadataServer(flight.FlightServerBase):
    """Answers the metadata commands with this module's tables (the ticket is the command)."""

    def __init__(self, descriptors: list[TableDescriptor]) -> None:
        super().__init__("grpc://127.0.0.1:0", auth_handler=_NoAuth())
        self.descriptors = descriptors

    def _answer(self, command: bytes) -> pa.Table:
        cmd = protocol.unpack_any(command)

        def opt(name: str) -> str | None:
            return getattr(cmd, name) if cmd.HasField(name) else None

        if isinstance(cmd, protocol.CommandGetSqlInfo):
            return metadata.sql_info_table(list(cmd.info))
        if isinstance(cmd, protocol.CommandGetCatalogs):
            return metadata.catalogs_table()
        if isinstance(cmd, protocol.CommandGetDbSchemas):
            return metadata.db_schemas_table({d.path.database for d in self.descriptors},
                                             opt("catalog"), opt("db_schema_filter_pattern"))
        if isinstance(cmd, protocol.CommandGetTables):
            return metadata.tables_table(
                self.descriptors, catalog=opt("catalog"),
                db_schema_filter_pattern=opt("db_schema_filter_pattern"),
                table_name_filter_pattern=opt("table_name_filter_pattern"),
                table_types=list(cmd.table_types), include_schema=cmd.include_schema)
        if isinstance(cmd, protocol.CommandGetTableTypes):
            return metadata.table_types_table()
        raise NotImplementedError(type(cmd).__name__)

    def get_flight_info(self, context, descriptor):  # noqa: ANN001
        table = self._answer(descriptor.command)
        return flight.FlightInfo(table.schema, descriptor,
                                 [flight.FlightEndpoint(descriptor.command, [])], table.num_rows, -1)

    def do_get(self, context, ticket):  # noqa: ANN001
        return flight.RecordBatchStream(self._answer(ticket.ticket))


def test_adbc_reads_info_objects_and_table_schema(descriptors: list[TableDescriptor]) -> None:
    with _MetadataServer(descriptors) as server:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Cannot disable autocommit"
            conn = dbapi.connect(f"grpc://127.0.0.1:{server.port}")
        try:
            info = conn.adbc_get_info()
            objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
            schema = conn.adbc_get_table_schema("orders", db_schema_filter="shop")
            types = conn.adbc_get_table_types()
        finally:
            conn.close()
    assert info["vendor_name"] == "flightstore"
    assert info["vendor_arrow_version"] == pa.__version__
    assert [c["catalog_name"] for c in objects] == ["flightstore"]
    shop = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}["shop"]
    orders = {t["table_name"]: t for t in shop["db_schema_tables"]}["orders"]
    columns = {c["column_name"]: c for c in orders["table_columns"]}
    assert columns["amount"]["xdbc_type_name"] == "DECIMAL"
    assert columns["customer"]["xdbc_scope_schema"] == "shop"
    assert schema.names == descriptors[1].schema.names
    assert [f.type for f in schema] == [f.type for f in descriptors[1].schema]
    assert types == ["TABLE"]
