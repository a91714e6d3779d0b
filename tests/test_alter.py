"""ALTER TABLE as pure functions (flightstore/alter.py): what each change does to a descriptor, what
is refused (and that a refused statement changes nothing), partition ids, JSON round trips, and a
property test that every widening allowed is lossless."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightstore.alter import (
    AddColumns,
    AddPartition,
    DropPartition,
    ModifyColumn,
    PartitionLimits,
    RenameTable,
    ResetOptions,
    SetOptions,
    apply_changes,
    change_from_json,
    widens_losslessly,
)
from flightstore.errors import AlreadyExists, InvalidInput, InvalidOption, PartitionNotFound, Unsupported
from flightstore.schema import TableDescriptor, TablePath

SCHEMA = pa.schema([("dt", pa.string()), ("id", pa.int64()), ("n", pa.int16()), ("f", pa.float32())])


def _table(**options) -> TableDescriptor:
    return TableDescriptor.create("db.t", SCHEMA, primary_key=["dt", "id"], partition_keys=["dt"],
                                  options={"bucket.num": "2", **options})


def test_add_columns_appends_nullable_columns_and_keeps_every_past_schema():
    t = _table()
    t2 = apply_changes(t, [AddColumns((pa.field("a", pa.string()), pa.field("b", pa.int32())))])
    t3 = apply_changes(t2, [AddColumns((pa.field("c", pa.float64()),))])
    assert t3.schema.names == ["dt", "id", "n", "f", "a", "b", "c"] and t3.version == 3
    assert t3.schema_of(1).names == t.schema.names and t3.schema_of(2).names == t2.schema.names
    assert t3.schemas == {1: t.schema, 2: t2.schema, 3: t3.schema}
    assert TableDescriptor.from_json(t3.to_json()) == t3
    with pytest.raises(InvalidInput, match="no schema version 4"):
        t3.schema_of(4)


@pytest.mark.parametrize("change, error, words", [
    (AddColumns((pa.field("ID", pa.int32()),)), AlreadyExists, "'ID' already exists"),
    (AddColumns((pa.field("x", pa.int32(), nullable=False),)), Unsupported, "must be nullable"),
    (AddColumns((pa.field("_change_type", pa.int32()),)), InvalidInput, "reserved"),
    (AddColumns((pa.field("x", pa.int32()), pa.field("X", pa.int8()))), AlreadyExists, "already exists"),
    (ModifyColumn("id", pa.decimal128(30, 0)), Unsupported, "key column"),
    (ModifyColumn("n", pa.int8()), Unsupported, "not a lossless widening"),
    (ModifyColumn("f", pa.int64()), Unsupported, "not a lossless widening"),
    (ModifyColumn("nope", pa.int64()), InvalidInput, "unknown column"),
    (SetOptions((("bucket.num", "4"),)), Unsupported, "'bucket.num' cannot change"),
    (SetOptions((("table.merge-engine", "first_row"),)), Unsupported, "'table.merge-engine' cannot change"),
    (SetOptions((("no.such", "1"),)), InvalidOption, "unknown table option 'no.such'"),
    (SetOptions((("table.log.ttl", "soon"),)), InvalidOption, "table.log.ttl"),
    (ResetOptions(("bucket.key",)), Unsupported, "'bucket.key' cannot change"),
    (RenameTable(TablePath("other", "u")), Unsupported, "stays in its database"),
    (RenameTable(TablePath("db", "bad-name")), InvalidInput, "invalid table name"),
    (AddPartition(("a",)), AlreadyExists, "already has partition 'a'"),
    (DropPartition(("zz",)), PartitionNotFound, "no partition 'zz'"),
])
def test_refused_changes_name_the_problem_and_change_nothing(change, error, words):
    t = apply_changes(_table(), [AddPartition(("a",))])
    before = t.to_json()
    with pytest.raises(error, match=words):
        apply_changes(t, [AddColumns((pa.field("ok", pa.string()),)), change])
    assert t.to_json() == before


def test_live_options_set_and_reset():
    t = apply_changes(_table(), [SetOptions((("table.log.ttl", "2d"), ("table.auto-partition.num-retention", "3")))])
    assert t.option("table.log.ttl") == 2 * 86_400_000 and t.option("table.auto-partition.num-retention") == 3
    t = apply_changes(t, [ResetOptions(("table.log.ttl",))])
    assert t.option("table.log.ttl") == 7 * 86_400_000 and t.version == 1  # options are no schema change


def test_partition_ids_are_never_reused_and_limits_hold():
    t = apply_changes(_table(), [AddPartition((d,)) for d in ("a", "b", "c")])
    t = apply_changes(t, [DropPartition(("b",)), AddPartition(("b",)), AddPartition(("d",), if_not_exists=True),
                          AddPartition(("d",), if_not_exists=True), DropPartition(("x",), if_exists=True)])
    assert [(p.id, p.name) for p in t.partitions] == [(0, "a"), (2, "c"), (3, "b"), (4, "d")]
    assert t.next_partition_id == 5
    with pytest.raises(InvalidInput, match=r"5 partitions, more than max.partition.num \(4\)"):
        apply_changes(t, [AddPartition(("e",))], PartitionLimits(max_partitions=4))
    with pytest.raises(InvalidInput, match=r"10 buckets, more than max.bucket.num \(9\)"):
        apply_changes(t, [AddPartition(("e",))], PartitionLimits(max_buckets=9))
    with pytest.raises(InvalidInput, match="not partitioned"):
        apply_changes(TableDescriptor.create("db.u", SCHEMA), [AddPartition(("a",))])


def test_changes_round_trip_through_json():
    changes = [AddColumns((pa.field("a", pa.decimal128(12, 3), metadata={b"comment": b"x"}),)),
               ModifyColumn("n", pa.int64()), SetOptions((("table.log.ttl", "1d"),)),
               ResetOptions(("table.log.ttl",)), RenameTable(TablePath("db", "u")),
               AddPartition(("a",), True), DropPartition(("a",), True)]
    assert [change_from_json(c.to_json()) for c in changes] == changes
    assert apply_changes(_table(), changes) == apply_changes(_table(), [change_from_json(c.to_json())
                                                                        for c in changes])


INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
NUMERIC = INTS + [pa.float32(), pa.float64(), pa.decimal128(5, 2), pa.decimal128(12, 2), pa.decimal128(20, 0),
                  pa.decimal128(38, 10)]


def _values(arrow_type: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_integer(arrow_type):
        bits = arrow_type.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if pa.types.is_float32(arrow_type):
        return st.floats(width=32, allow_nan=False)
    if pa.types.is_floating(arrow_type):
        return st.floats(allow_nan=False)
    digits = arrow_type.precision - arrow_type.scale
    return st.decimals(min_value=-(10 ** digits) + 1, max_value=10 ** digits - 1, places=arrow_type.scale,
                       allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), source=st.sampled_from(NUMERIC), target=st.sampled_from(NUMERIC))
def test_every_allowed_widening_keeps_every_value(data, source, target):
    if not widens_losslessly(source, target):
        return
    values = data.draw(st.lists(_values(source), min_size=1, max_size=20))
    original = pa.array(values, source)
    widened = original.cast(target)  # the safe cast raises on any loss
    back = widened.cast(source)
    assert back.equals(original)
    if pa.types.is_decimal(target):
        assert all(isinstance(v, decimal.Decimal) for v in widened.to_pylist())
