"""Tests of flightstore.wire.point_keys: a one-row key batch of integer columns is read without
Arrow; anything else (several rows, a null, other types) is left to the general path."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flightstore.wire.point_keys import PointKeys

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def _ints(t: pa.DataType) -> st.SearchStrategy[int]:
    if pa.types.is_signed_integer(t):
        return st.integers(-(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1)
    return st.integers(0, (1 << t.bit_width) - 1)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), types=st.lists(st.sampled_from(INT_TYPES), min_size=1, max_size=4))
def test_one_row_integer_keys_read_as_their_values(data, types):
    schema = pa.schema([(f"k{i}", t) for i, t in enumerate(types)])
    values = tuple(data.draw(_ints(t)) for t in types)
    reader = PointKeys.of(schema)
    batch = pa.RecordBatch.from_arrays([pa.array([v], t) for v, t in zip(values, types)], schema=schema)
    assert reader.values(batch.serialize()) == values
    assert reader.values(b"x" * 24 + batch.serialize().to_pybytes(), 24) == values
    two = pa.RecordBatch.from_arrays([pa.array([v, v], t) for v, t in zip(values, types)], schema=schema)
    assert reader.values(two.serialize()) is None
    null = pa.RecordBatch.from_arrays([pa.array([None], types[0])] +
                                      [pa.array([v], t) for v, t in zip(values[1:], types[1:])], schema=schema)
    assert reader.values(null.serialize()) is None


def test_keys_of_other_types_have_no_reader_and_other_messages_do_not_match():
    assert PointKeys.of(pa.schema([("s", pa.string())])) is None
    assert PointKeys.of(pa.schema([("k", pa.int64()), ("s", pa.string())])) is None
    assert PointKeys.of(pa.schema([("f", pa.float64())])) is None
    reader = PointKeys.of(pa.schema([("k", pa.int64())]))
    other = pa.record_batch({"k": pa.array([1], pa.int32())})
    assert reader.values(other.serialize()) is None
    assert reader.values(b"") is None


@settings(max_examples=200, deadline=None)
@given(data=st.data(), types=st.lists(st.sampled_from(INT_TYPES), min_size=1, max_size=3))
def test_a_clients_single_key_is_written_as_the_batch_encoding_writes_it(data, types):
    from flightstore.lookup_stream import key_batch
    from flightstore.wire.lookups import encode_batch

    schema = pa.schema([(f"k{i}", t) for i, t in enumerate(types)])
    writer = PointKeys.of(schema)
    keys = {f"k{i}": [data.draw(_ints(t))] for i, t in enumerate(types)} | {"other": ["ignored"]}
    assert writer.encode(keys) == encode_batch(key_batch(keys, schema)).to_pybytes()
    assert writer.values(writer.encode(keys)) == tuple(keys[f"k{i}"][0] for i in range(len(types)))
    wide = pa.types.is_unsigned_integer(types[0]) and -1 or (1 << types[0].bit_width)
    for bad in ({**keys, "k0": [wide]}, {**keys, "k0": [True]}, {**keys, "k0": [None]}, {**keys, "k0": [1, 2]},
                {**keys, "k0": 5}, {k: v for k, v in keys.items() if k != "k0"}):
        assert writer.encode(bad) is None
