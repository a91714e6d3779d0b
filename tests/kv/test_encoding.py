"""Tests of flightstore.kv.encoding: key order, key prefixes, and the row value round trip."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.errors import CorruptData, InvalidInput, SchemaMismatch
from flightstore.kv.encoding import RowCodec, encode_key_prefix, encode_keys

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
NASTY_TEXT = st.text(alphabet=st.sampled_from(["\x00", "\xff", "a", "b", "\x01", "é", "😀"]),
                     max_size=6)
NASTY_BINARY = st.lists(st.sampled_from([0, 1, 0xFE, 0xFF, 0x61]), max_size=6).map(bytes)


# ---- value strategies per Arrow type --------------------------------------------------------

def _ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    if signed:
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return st.integers(0, (1 << bits) - 1)


def _decimals(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    bound = 10 ** precision - 1
    return st.integers(-bound, bound).map(lambda v: decimal.Decimal(f"{v}e-{scale}"))  # exact


def _value_strategy(t: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_boolean(t):
        return st.booleans()
    if pa.types.is_integer(t):
        return _ints(t.bit_width, pa.types.is_signed_integer(t))
    if pa.types.is_float32(t):
        return st.floats(width=32)
    if pa.types.is_float64(t):
        return st.floats()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return TEXT | NASTY_TEXT
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return st.binary(max_size=12) | NASTY_BINARY
    if pa.types.is_date32(t):
        return st.integers(-(1 << 31), (1 << 31) - 1)
    if pa.types.is_date64(t):
        return st.integers(-(1 << 33), 1 << 33).map(lambda d: d * 86_400_000)
    if pa.types.is_time32(t):
        return st.integers(0, 86_399 if t.unit == "s" else 86_399_999)
    if pa.types.is_time64(t):
        return st.integers(0, 86_399_999_999 if t.unit == "us" else 86_399_999_999_999)
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return _ints(64, True)
    if pa.types.is_decimal(t):
        return _decimals(t.precision, t.scale)
    raise AssertionError(t)


ROW_TYPES = [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
    pa.uint32(), pa.uint64(), pa.float32(), pa.float64(), pa.string(), pa.large_string(),
    pa.binary(), pa.large_binary(), pa.date32(), pa.date64(), pa.time32("s"), pa.time32("ms"),
    pa.time64("us"), pa.time64("ns"), pa.timestamp("s"), pa.timestamp("ms", "UTC"),
    pa.timestamp("us"), pa.timestamp("ns", "Europe/Paris"), pa.duration("s"), pa.duration("ns"),
    pa.decimal128(1, 0), pa.decimal128(9, 3), pa.decimal128(18, 18), pa.decimal128(38, 10),
]
KEY_TYPES = [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(),
    pa.uint64(), pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.binary(),
    pa.large_binary(), pa.date32(), pa.time64("ns"), pa.timestamp("us", "UTC"),
    pa.decimal128(12, 2),
]


def _array(values: list, t: pa.DataType) -> pa.Array:
    if pa.types.is_decimal(t):
        return pa.array(values, t)
    storage = {pa.types.is_date32: pa.int32(), pa.types.is_time32: pa.int32()}
    for check, physical in storage.items():
        if check(t):
            return pa.array(values, physical).view(t)
    if pa.types.is_temporal(t):
        return pa.array(values, pa.int64()).view(t)
    return pa.array(values, t)


@st.composite
def tables(draw, types: list[pa.DataType], nulls: bool = True, max_rows: int = 12) -> pa.Table:
    chosen = draw(st.lists(st.sampled_from(types), min_size=1, max_size=6))
    n = draw(st.integers(0, max_rows))
    columns = {}
    fields = []
    for i, t in enumerate(chosen):
        values = st.none() | _value_strategy(t) if nulls else _value_strategy(t)
        columns[f"c{i}"] = _array(draw(st.lists(values, min_size=n, max_size=n)), t)
        fields.append(pa.field(f"c{i}", t, nullable=draw(st.booleans()) if nulls else True))
    return pa.Table.from_pydict(columns, schema=pa.schema(fields))


def _exact(table: pa.Table) -> list[list]:
    """Column values as Python lists, floats as their bit patterns (NaN == NaN, -0.0 != 0.0)."""
    out = []
    for col in table.columns:
        col = col.combine_chunks()
        if pa.types.is_temporal(col.type):  # compare storage: as_py() fails outside datetime's range
            col = col.view(pa.int32() if col.type.bit_width == 32 else pa.int64())
        values = col.to_pylist()
        if pa.types.is_floating(col.type):
            fmt = "<f" if pa.types.is_float32(col.type) else "<d"
            values = [None if v is None else struct.pack(fmt, v) for v in values]
        out.append(values)
    return out


def _assert_same(actual: pa.Table, expected: pa.Table) -> None:
    assert actual.schema.equals(expected.schema, check_metadata=True)
    assert _exact(actual) == _exact(expected)


# ---- RowCodec -------------------------------------------------------------------------------

@SETTINGS
@given(tables(ROW_TYPES))
def test_row_round_trip(table):
    codec = RowCodec(table.schema)
    values = codec.encode(table)
    assert len(values) == table.num_rows and all(isinstance(v, bytes) for v in values)
    _assert_same(codec.decode(values), table)
    _assert_same(codec.decode(pa.array(values, pa.binary())), table)


@SETTINGS
@given(tables(ROW_TYPES), st.data())
def test_row_decode_column_subset_is_projection(table, data):
    codec = RowCodec(table.schema)
    values = codec.encode(table)
    subset = data.draw(st.permutations(table.column_names).flatmap(
        lambda names: st.integers(1, len(names)).map(lambda k: names[:k])))
    _assert_same(codec.decode(values, subset), table.select(subset))  # few rows: sliced row by row
    _assert_same(codec.decode(pa.array(values, pa.binary()), subset), table.select(subset))  # vectorized


@SETTINGS
@given(tables(ROW_TYPES, max_rows=40))
def test_row_decode_paths_agree_around_the_few_rows_cut(table):
    codec = RowCodec(table.schema)
    values = codec.encode(table)
    for n in range(max(0, len(values) - 1), len(values) + 1):  # a list (<=16: the row path) and an array
        _assert_same(codec.decode(values[:n]), codec.decode(pa.array(values[:n], pa.large_binary())))


@SETTINGS
@given(tables(ROW_TYPES, max_rows=4), st.data())
def test_row_decode_of_one_value_matches_the_vectorized_path(table, data):
    """A point lookup's one value is decoded on a path of its own: same arrays, nulls, types."""
    codec = RowCodec(table.schema)
    names = data.draw(st.permutations(table.column_names))
    for value in codec.encode(table):
        for columns in (None, names):
            alone = codec.decode([value], columns)
            alone.validate(full=True)
            _assert_same(alone, codec.decode(pa.array([value], pa.large_binary()), columns))


def test_row_special_values():
    schema = pa.schema([("s", pa.string()), ("b", pa.binary()), ("f", pa.float64()),
                        ("g", pa.float32())])
    table = pa.table({
        "s": ["", None, "héllo wörld ✓ 😀", "a\x00b"],
        "b": [b"", None, b"\x00\xff", b"x" * 1000],
        "f": [math.nan, -0.0, math.inf, -math.inf],
        "g": pa.array([-0.0, math.nan, -math.inf, None], pa.float32()),
    }, schema=schema)
    codec = RowCodec(schema)
    decoded = codec.decode(codec.encode(table))
    _assert_same(decoded, table)
    assert decoded.column("s").to_pylist()[:2] == ["", None]  # empty string is not null
    assert math.copysign(1.0, decoded.column("f")[1].as_py()) == -1.0


def test_row_zero_and_one_rows():
    schema = pa.schema([("k", pa.int64(), False), ("v", pa.large_string()),
                        ("t", pa.timestamp("ns", "UTC"))])
    codec = RowCodec(schema)
    empty = schema.empty_table()
    assert codec.encode(empty) == []
    assert codec.decode([]).schema == schema and codec.decode([]).num_rows == 0
    assert codec.decode([], ["v"]).schema == pa.schema([schema.field("v")])
    one = pa.table({"k": [7], "v": ["x"], "t": pa.array([5], pa.int64()).view(schema.field("t").type)},
                   schema=schema)
    _assert_same(codec.decode(codec.encode(one)), one)
    batch = one.to_batches()[0]
    assert codec.encode(batch) == codec.encode(one)


def test_row_encode_chunked_sliced_and_reordered_input():
    schema = pa.schema([("a", pa.int32()), ("b", pa.bool_()), ("c", pa.string())])
    full = pa.table({"a": list(range(20)), "b": [i % 3 == 0 for i in range(20)],
                     "c": [None if i % 4 == 0 else str(i) for i in range(20)]}, schema=schema)
    chunked = pa.concat_tables([full.slice(0, 7), full.slice(7)])
    sliced = full.slice(3, 11)
    codec = RowCodec(schema)
    _assert_same(codec.decode(codec.encode(chunked)), full)
    _assert_same(codec.decode(codec.encode(sliced)), sliced)
    reordered = full.select(["c", "a", "b"])
    assert codec.encode(reordered) == codec.encode(full)  # columns matched by name
    widened = full.set_column(0, "a", full.column("a").cast(pa.int64()))
    assert codec.encode(widened) == codec.encode(full)  # cast to the schema's type


def test_row_null_slots_encode_deterministically():
    schema = pa.schema([("a", pa.int64()), ("b", pa.bool_())])
    codec = RowCodec(schema)
    masked = pa.table({"a": pa.array([123, 5], mask=[True, False]),
                       "b": pa.array([True, False], mask=[True, False])}, schema=schema)
    plain = pa.table({"a": [None, 5], "b": [None, False]}, schema=schema)
    assert codec.encode(masked) == codec.encode(plain)


def test_row_errors():
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    codec = RowCodec(schema)
    with pytest.raises(InvalidInput, match="list"):
        RowCodec(pa.schema([("l", pa.list_(pa.int32()))]))
    with pytest.raises(SchemaMismatch, match="'s'"):
        codec.encode(pa.table({"a": [1]}))
    with pytest.raises(SchemaMismatch, match="'a'"):
        codec.encode(pa.table({"a": ["x"], "s": ["y"]}))
    with pytest.raises(InvalidInput, match="'zz'"):
        codec.decode([], ["zz"])
    good = codec.encode(pa.table({"a": [1], "s": ["hello"]}, schema=schema))[0]
    with pytest.raises(CorruptData):
        codec.decode([good[:5]])
    with pytest.raises(CorruptData):
        codec.decode([good + b"!"])
    with pytest.raises(InvalidInput):
        codec.decode(pa.array([good, None]))


# ---- keys -----------------------------------------------------------------------------------

def _sort_key(value, t: pa.DataType):
    """The SQL order of one key value as a Python-comparable object."""
    if isinstance(value, float):
        return 0.0 if value == 0 else value  # -0.0 == 0.0, nan excluded
    return value


@st.composite
def key_tables(draw, max_rows: int = 25):
    types = draw(st.lists(st.sampled_from(KEY_TYPES), min_size=1, max_size=4))
    n = draw(st.integers(1, max_rows))
    columns, strategies = {}, []
    for t in types:
        strategy = _value_strategy(t)
        if pa.types.is_floating(t):
            strategy = st.floats(width=32 if pa.types.is_float32(t) else 64, allow_nan=False)
        strategies.append(strategy)
    # Few distinct values per column, so ties on leading columns (and prefix matches) are common.
    pools = [draw(st.lists(s, min_size=1, max_size=4)) for s in strategies]
    rows = [tuple(draw(st.sampled_from(pool)) for pool in pools) for _ in range(n)]
    for i, t in enumerate(types):
        columns[f"k{i}"] = _array([row[i] for row in rows], t)
    table = pa.Table.from_pydict(columns)
    keys = [tuple(_sort_key(v, t) for v, t in zip(row, types)) for row in rows]
    return table, keys


@SETTINGS
@given(key_tables())
def test_key_bytes_order_equals_tuple_order(case):
    table, keys = case
    encoded = encode_keys(table, table.column_names)
    for i in range(len(keys)):
        for j in range(len(keys)):
            assert (encoded[i] < encoded[j]) == (keys[i] < keys[j])
            assert (encoded[i] == encoded[j]) == (keys[i] == keys[j])
    by_bytes = [keys[i] for i in sorted(range(len(keys)), key=encoded.__getitem__)]
    assert by_bytes == sorted(keys)


@SETTINGS
@given(key_tables())
def test_key_prefix_property(case):
    table, keys = case
    names = table.column_names
    full = encode_keys(table, names)
    for k in range(1, len(names) + 1):
        prefix = encode_keys(table, names[:k])
        assert prefix == encode_key_prefix(table.select(names[:k]), names[:k])
        for i in range(len(keys)):
            assert full[i].startswith(prefix[i])
            # The prefix range holds exactly the rows sharing the leading k values.
            matches = {j for j in range(len(keys)) if full[j].startswith(prefix[i])}
            assert matches == {j for j in range(len(keys)) if keys[j][:k] == keys[i][:k]}


INTEGER_KEY_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(),
                     pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


@SETTINGS
@given(st.lists(st.sampled_from(INTEGER_KEY_TYPES), min_size=1, max_size=3), st.data())
def test_one_row_integer_keys_match_the_vectorized_encoding(types, data):
    """A one-row integer key is encoded in plain Python; the rows of a many-row (vectorized)
    encode are the reference, boundary values included."""
    n = data.draw(st.integers(2, 8))
    columns = {}
    for i, t in enumerate(types):
        info = np.iinfo(t.to_pandas_dtype())
        edges = st.sampled_from([int(info.min), int(info.max), 0, 1] + ([-1] if info.min < 0 else []))
        values = st.one_of(edges, st.integers(int(info.min), int(info.max)))
        columns[f"k{i}"] = pa.array(data.draw(st.lists(values, min_size=n, max_size=n)), t)
    table = pa.table(columns)
    many = encode_keys(table, table.column_names)
    assert [encode_keys(table.slice(i, 1), table.column_names)[0] for i in range(n)] == many


def test_key_known_orders():
    floats = [-math.inf, -1e300, -1.5, -1e-300, -0.0, 0.0, 1e-300, 2.0, math.inf, math.nan]
    enc = encode_keys(pa.table({"f": floats}), ["f"])
    assert enc == sorted(enc)
    assert enc[4] == enc[5]  # -0.0 and 0.0 are one key
    assert encode_keys(pa.table({"f": [float("nan"), -float("nan")]}), ["f"]).count(enc[-1]) == 2
    strings = ["", "\x00", "\x00\x00", "\x00\xff", "\x01", "a", "a\x00", "a\x00a", "a\x01", "ab",
               "b", "é", "\xff", "😀"]
    enc = encode_keys(pa.table({"s": strings}), ["s"])
    assert enc == sorted(enc)
    ints = pa.array([-(1 << 63), -1, 0, 1, (1 << 63) - 1], pa.int64())
    enc = encode_keys(pa.table({"i": ints}), ["i"])
    assert enc == sorted(enc) and all(len(e) == 8 for e in enc)
    dec = pa.array([decimal.Decimal(v) for v in ("-10.5", "-0.01", "0", "0.01", "99.99")],
                   pa.decimal128(6, 2))
    enc = encode_keys(pa.table({"d": dec}), ["d"])
    assert enc == sorted(enc)
    days = pa.array([dt.date(1900, 1, 1), dt.date(1969, 12, 31), dt.date(2024, 2, 29)])
    enc = encode_keys(pa.table({"d": days}), ["d"])
    assert enc == sorted(enc)


def test_key_sliced_chunked_and_batch_input():
    table = pa.table({"a": list(range(-10, 10)), "s": [str(i) for i in range(20)]})
    expected = encode_keys(table, ["a", "s"])
    chunked = pa.concat_tables([table.slice(0, 5), table.slice(5)])
    assert encode_keys(chunked, ["a", "s"]) == expected
    assert encode_keys(table.slice(4, 6), ["a", "s"]) == expected[4:10]
    assert encode_keys(table.to_batches()[0], ["a", "s"]) == expected
    assert encode_keys(table.slice(0, 0), ["a", "s"]) == []
    bools = pa.table({"b": [True, False, True, False, True]}).slice(1, 4)
    assert encode_keys(bools, ["b"]) == [b"\x00", b"\x01", b"\x00", b"\x01"]


def test_key_errors_name_the_column():
    table = pa.table({"id": [1, None], "name": ["a", "b"], "tags": [[1], [2]]})
    with pytest.raises(InvalidInput, match="'id'.*null"):
        encode_keys(table, ["name", "id"])
    with pytest.raises(InvalidInput, match="'tags'"):
        encode_keys(table, ["tags"])
    with pytest.raises(InvalidInput, match="'nope'"):
        encode_keys(table, ["nope"])


def test_key_prefix_from_mapping_uses_the_schema_types():
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("ts", pa.timestamp("ms"))])
    table = pa.table({"region": ["eu", "us"], "id": [5, 6],
                      "ts": pa.array([0, 1], pa.int64()).view(pa.timestamp("ms"))}, schema=schema)
    keys = encode_keys(table, ["region", "id", "ts"])
    assert encode_key_prefix({"region": "eu"}, ["region"], schema=schema) == [b"eu\x00\x00"]
    prefix = encode_key_prefix({"region": ["eu", "us"], "id": [5, 6]}, ["region", "id"],
                               schema=schema)
    assert prefix == encode_keys(table, ["region", "id"])
    assert all(k.startswith(p) for k, p in zip(keys, prefix))
    assert encode_key_prefix(table, ["region", "id"], schema=schema) == prefix
    with pytest.raises(InvalidInput, match="'id'"):
        encode_key_prefix({"region": "eu"}, ["region", "id"], schema=schema)
    with pytest.raises(InvalidInput, match="'id'"):
        encode_key_prefix({"id": 1 << 40}, ["id"], schema=schema)


def test_large_batch_round_trip_vectorized():
    n = 5000
    rng = np.random.default_rng(1)
    table = pa.table({
        "i": rng.integers(-1000, 1000, n),
        "s": pa.array([f"v{i}" * (i % 5) for i in range(n)], mask=rng.random(n) < 0.2),
        "f": rng.normal(size=n),
    })
    codec = RowCodec(table.schema)
    _assert_same(codec.decode(codec.encode(table)), table)
    keys = encode_keys(table, ["i"])
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    assert (np.diff(table.column("i").to_numpy()[order]) >= 0).all()


def test_variable_columns_decode_by_one_gather_and_in_blocks_alike():
    """The variable-width columns of a decode are gathered by one index when their bytes fit one
    gather block (a lookup's few dozen rows), column by column in blocks otherwise: both give the
    encoded table, in any column order and subset, nulls and empty values included."""
    from flightstore.kv import encoding

    rng = np.random.default_rng(7)
    for n, width in ((3, 5), (40, 20), (1500, 120)):  # the last: more than one gather block of bytes
        def strings(kind):
            return [None if rng.random() < 0.15 else kind("x" * int(rng.integers(0, width)) + str(i))
                    if rng.random() < 0.9 else kind("") for i in range(n)]
        table = pa.table({"a": pa.array(strings(str), pa.string()),
                          "i": pa.array(rng.integers(-5, 5, n), pa.int64()),
                          "b": pa.array(strings(str.encode), pa.binary()),
                          "c": pa.array(strings(str), pa.large_string()),
                          "d": pa.array(strings(str.encode), pa.large_binary())})
        codec = RowCodec(table.schema)
        values = pa.array(codec.encode(table), pa.large_binary())
        assert (sum(map(len, values.to_pylist())) > encoding._GATHER_BYTES) == (n == 1500)
        for columns in (None, ["d", "i", "a"], ["c"], ["b", "a", "c", "d"]):
            decoded = codec.decode(values, columns)
            decoded.validate(full=True)
            _assert_same(decoded, table if columns is None else table.select(columns))
