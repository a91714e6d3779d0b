"""The one-key point lookup (``TableReads._point_key`` + ``KvTablet.lookup_key`` +
``RowCodec.decode_value``): a one-row key of integer primary-key columns is bucketed, encoded and
decoded on Python ints, not arrays. It must answer exactly what the general path answers: the same
bucket, the same encoded key, the same row (every value type, nulls), no row for a missing key, and
the general path's errors and conversions for keys it does not take."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from flightstore.errors import InvalidInput
from flightstore.kv.encoding import encode_keys

KEY_TYPES = [("a", pa.int8()), ("b", pa.uint16()), ("c", pa.int32()), ("d", pa.uint64()), ("e", pa.int64())]
VALUE_FIELDS = [("s", pa.string()), ("ls", pa.large_string()), ("flag", pa.bool_()), ("x", pa.float64()),
                ("bin", pa.binary()), ("n", pa.int16())]
# uint64 keys past 2**63 cannot be written (bucket_ids casts them to int64): not probed here.
BOUNDS = {pa.int8(): (-128, 127), pa.uint16(): (0, 65535), pa.int32(): (-2**31, 2**31 - 1),
          pa.uint64(): (0, 2**63 - 1), pa.int64(): (-2**63, 2**63 - 1)}


def _value(rng: random.Random, t: pa.DataType) -> object:
    if rng.random() < 0.2:
        return None
    if pa.types.is_boolean(t):
        return rng.random() < 0.5
    if pa.types.is_floating(t):
        return rng.uniform(-1e6, 1e6)
    if pa.types.is_binary(t):
        return rng.randbytes(rng.randint(0, 9))
    if pa.types.is_integer(t):
        return rng.randint(-2**15, 2**15 - 1)
    return "".join(rng.choice("xyzé") for _ in range(rng.randint(0, 7)))


def _rows(rng: random.Random, keys: list[tuple[str, pa.DataType]], n: int) -> pa.Table:
    """``n`` rows of distinct keys (extremes of each key type among them) and random values."""
    rows = {}
    for _ in range(n):
        key = tuple(rng.choice([low, high, 0, rng.randint(low, high)])
                    for low, high in (BOUNDS[t] for _, t in keys))
        rows[key] = dict(zip([name for name, _ in keys], key)) | {
            name: _value(rng, t) for name, t in VALUE_FIELDS}
    return pa.Table.from_pylist(list(rows.values()), pa.schema(keys + VALUE_FIELDS))


@pytest.mark.parametrize("keys,options", [
    (KEY_TYPES[:1], {"bucket.num": 1}),
    (KEY_TYPES[3:4], {"bucket.num": 3}),
    (KEY_TYPES, {"bucket.num": 5}),
    (KEY_TYPES[1:4], {"bucket.num": 4, "bucket.key": "b,c"}),
])
def test_one_key_lookup_answers_what_the_general_path_does(store, keys, options):
    rng = random.Random(23)
    schema = pa.schema(keys + VALUE_FIELDS)
    table = store.create_table("points", schema, primary_key=[n for n, _ in keys], options=options)
    rows = _rows(rng, keys, 300)
    table.upsert(rows)
    key_schema = pa.schema([table.schema.field(n) for n, _ in keys])
    expected = {tuple(r[n] for n, _ in keys): r for r in rows.to_pylist()}
    probes = [rows.slice(i, 1).select([n for n, _ in keys]) for i in range(0, rows.num_rows, 7)]
    missing = rows.slice(0, 1).select([n for n, _ in keys]).to_pylist()[0]
    missing[keys[-1][0]] = BOUNDS[keys[-1][1]][0] + 1  # most likely absent; checked below either way
    probes.append(pa.Table.from_pylist([missing], key_schema))
    for probe in probes:
        point = table._point_key(probe)
        assert point is not None, "a one-row integer key takes the point path"
        assert point == (int(table.buckets_of(probe)[0]), encode_keys(probe, [n for n, _ in keys])[0])
        got = table.lookup(probe)
        key = tuple(probe.to_pylist()[0].values())
        assert got.schema == table.schema
        assert got.to_pylist() == ([expected[key]] if key in expected else [])
        projected = table.lookup(probe.to_batches()[0], ["ls", "flag", keys[0][0]])
        assert projected.to_pylist() == ([{c: expected[key][c] for c in ["ls", "flag", keys[0][0]]}]
                                         if key in expected else [])


def test_keys_the_point_path_does_not_take_go_the_general_way(store):
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = store.create_table("general", schema, primary_key=["id"], options={"bucket.num": 4})
    table.upsert(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", None, "c"]}))
    narrow = pa.table({"id": pa.array([3], pa.int32())})
    assert table._point_key(narrow) is None  # another type: the general path casts it
    assert table.lookup(narrow).to_pylist() == [{"id": 3, "v": "c"}]
    null = pa.table({"id": pa.array([None], pa.int64())})
    assert table._point_key(null) is None
    with pytest.raises(InvalidInput, match="must not be null"):
        table.lookup(null)
    with pytest.raises(InvalidInput, match="no column"):
        table.lookup(pa.table({"id": pa.array([1], pa.int64())}), ["nope"])
    assert table.lookup(pa.table({"id": pa.array([2], pa.int64())})).to_pylist() == [{"id": 2, "v": None}]

    strings = store.create_table("named", schema.remove(0).insert(0, pa.field("id", pa.string())),
                                 primary_key=["id"], options={"bucket.num": 2})
    strings.upsert(pa.table({"id": ["k"], "v": ["x"]}))
    assert strings._point_key(pa.table({"id": ["k"]})) is None  # not integers: the general path
    assert strings.lookup(pa.table({"id": ["k"]})).to_pylist() == [{"id": "k", "v": "x"}]


@pytest.mark.parametrize("keys,options", [
    (KEY_TYPES[4:5], {"bucket.num": 4}),
    (KEY_TYPES, {"bucket.num": 5}),
    (KEY_TYPES[1:4], {"bucket.num": 4, "bucket.key": "b,c"}),
])
def test_a_lookup_of_keys_in_every_bucket_answers_each_row_in_key_order(store, keys, options):
    """A lookup of many keys spread over the buckets (shuffled, some missing) reads each bucket's
    keys as one slice of the keys sorted by bucket, and answers exactly the rows of its keys, in
    the order asked, missing keys skipped, in any projection."""
    rng = random.Random(5)
    names = [n for n, _ in keys]
    table = store.create_table("many", pa.schema(keys + VALUE_FIELDS), primary_key=names, options=options)
    rows = _rows(rng, keys, 400)
    table.upsert(rows)
    expected = {tuple(r[n] for n in names): r for r in rows.to_pylist()}
    present = list(expected)
    for size in (2, 9, 32, 150):
        asked = rng.sample(present, min(size, len(present)))
        absent = tuple(BOUNDS[t][0] + 1 for _, t in keys)
        if absent not in expected:
            asked.insert(rng.randrange(len(asked) + 1), absent)
        probe = pa.Table.from_pylist([dict(zip(names, key)) for key in asked],
                                     pa.schema([table.schema.field(n) for n in names]))
        assert len(set(table.buckets_of(probe).tolist())) > 1
        got = table.lookup(probe)
        assert got.schema == table.schema
        assert got.to_pylist() == [expected[key] for key in asked if key in expected]
        columns = ["bin", names[-1], "s"]
        assert table.lookup(probe, columns).to_pylist() == [
            {c: expected[key][c] for c in columns} for key in asked if key in expected]
