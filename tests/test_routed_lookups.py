"""The client's placement of one key of integer columns (flightstore/routed_lookups.py): worked out
on Python ints, it names the leader :func:`split_by_leader` names for the same key as a table, for
every integer type, composite and partial bucket keys and layouts with leaderless buckets; what it
does not place (several keys, nulls, bools, out-of-range values, other types) goes the general way."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightstore.routed_lookups import point_leader, point_values, split_by_leader

INTEGER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def _range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if pa.types.is_signed_integer(t) else (0, (1 << bits) - 1)


@st.composite
def keyed_layouts(draw):
    types = draw(st.lists(st.sampled_from(INTEGER_TYPES), min_size=1, max_size=3))
    names = [f"k{i}" for i in range(len(types))]
    bucket_key = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    buckets = draw(st.integers(1, 12))
    leaders = draw(st.lists(st.sampled_from(["grpc://a", "grpc://b", "grpc://c", None]),
                            min_size=buckets, max_size=buckets))
    values = tuple(draw(st.integers(*_range(t))) for t in types)
    layout = {"leaders": leaders, "bucket_key": bucket_key, "num_buckets": buckets, "partitioned": False}
    return pa.schema(list(zip(names, types))), layout, values


@settings(max_examples=300, deadline=None)
@given(keyed_layouts())
def test_one_integer_key_is_placed_where_split_by_leader_places_it(case):
    schema, layout, values = case
    keys = {name: [value] for name, value in zip(schema.names, values)}
    assert point_values(keys, schema) == values
    table = pa.table({name: pa.array([value], t) for name, value, t in zip(schema.names, values, schema.types)})
    expected = split_by_leader(layout, table)
    assert point_leader(layout, schema.names, values) == [(expected[0][0], None)]


def test_what_is_not_one_integer_key_goes_the_general_way():
    schema = pa.schema([("id", pa.int32()), ("n", pa.uint8())])
    assert point_values({"id": [5], "n": [255], "other": ["x", "y"]}, schema) == (5, 255)
    assert point_values({"id": (5,), "n": [0]}, schema) == (5, 0)
    for keys in [{"id": [5, 6], "n": [1, 2]}, {"id": [None], "n": [1]}, {"id": [True], "n": [1]},
                 {"id": [5]}, {"id": [2 ** 31], "n": [1]}, {"id": [5], "n": [256]}, {"id": [5], "n": [-1]},
                 {"id": [5.0], "n": [1]}, {"id": 5, "n": [1]}, pa.table({"id": [5], "n": [1]})]:
        assert point_values(keys, schema) is None, keys
    assert point_values({"id": ["5"]}, pa.schema([("id", pa.string())])) is None
    layout = {"leaders": ["grpc://a"] * 4, "bucket_key": ["id"], "num_buckets": 4, "partitioned": False}
    assert point_leader(None, ["id"], (5,)) is None
    assert point_leader({**layout, "partitioned": True}, ["id"], (5,)) is None
    assert point_leader({**layout, "bucket_key": ["dt"]}, ["id"], (5,)) is None


@pytest.mark.parametrize("t", INTEGER_TYPES)
def test_the_limits_of_each_integer_type(t):
    low, high = _range(t)
    schema = pa.schema([("id", t)])
    layout = {"leaders": ["grpc://a", "grpc://b", None, "grpc://c", "grpc://d"], "bucket_key": ["id"],
              "num_buckets": 5, "partitioned": False}
    for value in (low, high, 0 if low == 0 else -1, 1):
        assert point_values({"id": [value]}, schema) == (value,)
        table = pa.table({"id": pa.array([value], t)})
        assert point_leader(layout, ["id"], (value,))[0][0] == split_by_leader(layout, table)[0][0]
    assert point_values({"id": [low - 1]}, schema) is None and point_values({"id": [high + 1]}, schema) is None
