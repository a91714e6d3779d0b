"""Tests of flightstore.kv.row_message: one stored row's IPC message, written from the value's
bytes, is byte for byte what pyarrow serializes of the decoded row (so readers decode the same
row), for every type the row codec holds, NULLs, projections and the key-index column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightstore.errors import CorruptData
from flightstore.kv.encoding import RowCodec
from flightstore.kv.row_message import message_layout
from flightstore.kv.versions import VersionedRowCodec
from tests.kv.test_encoding import ROW_TYPES, SETTINGS, tables


def _expected(codec: RowCodec, value: bytes, columns: list[str], key_index: bool) -> pa.RecordBatch:
    batch = codec.decode_value(value, columns).to_batches()[0]
    if key_index:
        batch = batch.append_column("__key_index", pa.array([0], pa.int32()))
    return batch


_BITS = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}


def _bitwise(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its floating-point columns viewed as integers of their width: NaN equals
    nothing, itself included, so ``equals`` compares floats by their bits here."""
    columns = [c.view(_BITS[c.type.bit_width]) if pa.types.is_floating(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


@SETTINGS
@given(table=tables(ROW_TYPES, max_rows=4), data=st.data())
def test_a_row_message_is_what_pyarrow_serializes_of_the_decoded_row(table, data):
    codec = RowCodec(table.schema, version=data.draw(st.none() | st.integers(0, 9)))
    columns = data.draw(st.lists(st.sampled_from(table.schema.names), min_size=1, unique=True))
    key_index = data.draw(st.booleans())
    writer = codec.row_message(columns, key_index)
    for value in codec.encode(table):
        expected = _expected(codec, value, columns, key_index)
        message, nbytes = writer.message(value, b"head")
        assert message[:4] == b"head"
        assert message[4:] == expected.serialize().to_pybytes()
        decoded = pa.ipc.read_record_batch(pa.py_buffer(message[4:]), expected.schema)
        decoded.validate(full=True)
        assert decoded.schema == expected.schema and _bitwise(decoded).equals(_bitwise(expected))
        assert nbytes == sum(b.size for column in expected.columns for b in column.buffers() if b is not None)
        assert writer.types == tuple(expected.schema.types)


def test_fixed_size_binary_and_an_all_null_row():
    schema = pa.schema([("k", pa.int64()), ("fb", pa.binary(3)), ("s", pa.string()), ("b", pa.bool_())])
    codec = RowCodec(schema)
    rows = pa.table({"k": [1, None], "fb": [b"abc", None], "s": ["x", None], "b": [False, None]}, schema=schema)
    for value in codec.encode(rows):
        expected = _expected(codec, value, schema.names, False)
        assert codec.row_message(schema.names).message(value)[0] == expected.serialize().to_pybytes()


def test_a_corrupt_value_is_refused_as_decoding_refuses_it():
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    codec = RowCodec(schema)
    value = codec.encode(pa.table({"k": [1], "s": ["hello"]}, schema=schema))[0]
    writer = codec.row_message(["k", "s"])
    for bad in (value[:5], value + b"x", value[:-1]):
        with pytest.raises(CorruptData):
            codec.decode_value(bad)
        with pytest.raises(CorruptData):
            writer.message(bad)


def test_a_value_of_an_older_schema_version_has_no_writer():
    """The versioned codec writes values of its current version only: an older value's row is
    conformed (columns added since are NULL) by decoding it."""
    old = pa.schema([("k", pa.int64())])
    new = old.append(pa.field("v", pa.string()))
    before = VersionedRowCodec({1: old}, 1).encode(pa.table({"k": [4]}, schema=old))[0]
    codec = VersionedRowCodec({1: old, 2: new}, 2)
    assert codec.row_message_of(before, ["k", "v"]) is None
    current = codec.encode(pa.table({"k": [5], "v": ["x"]}, schema=new))[0]
    assert codec.row_message_of(current, ["k", "v"]).message(current)[0] == \
        codec.decode_value(current, ["k", "v"]).to_batches()[0].serialize().to_pybytes()


def test_message_layout_finds_the_patched_fields():
    batch = pa.record_batch({"a": pa.array([7], pa.int64()), "s": ["xyz"]})
    message = batch.serialize().to_pybytes()
    end, nodes, node_count, buffers, buffer_count, body_length = message_layout(message)
    assert (node_count, buffer_count) == (2, 5)
    assert len(message) - end == int.from_bytes(message[body_length:body_length + 8], "little") == 24
    assert message[nodes:nodes + 16] == (1).to_bytes(8, "little") + (0).to_bytes(8, "little")
    assert message[buffers + 16 * 4:buffers + 16 * 5] == (16).to_bytes(8, "little") + (3).to_bytes(8, "little")
