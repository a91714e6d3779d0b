"""Bucket assignment matches Iceberg's murmur3 bucket transform and is vectorized."""

from __future__ import annotations

import struct

import mmh3
import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from flightstore.bucketing import bucket_ids, hash_column, murmur3_32


def test_iceberg_spec_values():
    # Values from the Iceberg spec's appendix (32-bit hash requirements).
    assert hash_column(pa.array([34], pa.int32()))[0] == 2017239379
    assert hash_column(pa.array([34], pa.int64()))[0] == 2017239379
    assert hash_column(pa.array(["iceberg"]))[0] == 1210000089


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=50))
def test_binary_hash_equals_reference(values):
    got = hash_column(pa.array(values, pa.binary()))
    assert got.tolist() == [mmh3.hash(v, signed=False) for v in values]


@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=50))
def test_long_hash_equals_reference(values):
    got = hash_column(pa.array(values, pa.int64()))
    assert got.tolist() == [mmh3.hash(struct.pack("<q", v), signed=False) for v in values]


def test_buckets_are_in_range_and_spread():
    ids = bucket_ids(pa.table({"k": np.arange(100_000)}), ["k"], 7)
    counts = np.bincount(ids, minlength=7)
    assert ids.min() >= 0 and ids.max() < 7
    assert counts.min() > 100_000 / 7 * 0.9
    assert murmur3_32(b"abc") == mmh3.hash(b"abc", signed=False)


def test_negative_zero_float_keys_share_the_bucket_of_zero():
    """-0.0 and 0.0 are one primary key (kv/encoding.py stores -0.0 as 0.0): one bucket too."""
    for arrow_type in (pa.float32(), pa.float64()):
        data = pa.table({"k": pa.array([0.0, -0.0, 1.5, -1.5], arrow_type)})
        for buckets in (2, 7, 16, 64):
            ids = bucket_ids(data, ["k"], buckets)
            assert ids[0] == ids[1]


def test_a_few_integer_keys_hash_as_the_vectorized_path_does():
    """Point lookups hash their few keys in plain Python: same buckets as the numpy path."""
    import numpy as np
    import pyarrow as pa

    from flightstore.bucketing import bucket_ids

    rng = np.random.default_rng(1)
    for n in (1, 3, 8):
        for buckets in (2, 7, 128):
            few = pa.table({"a": pa.array(rng.integers(-2**62, 2**62, size=n)),
                            "c": pa.array(rng.integers(-100, 100, size=n).astype(np.int32))})
            many = pa.concat_tables([few] * 3)  # above the scalar limit: the vectorized path
            for keys in (["a"], ["a", "c"]):
                assert (bucket_ids(many, keys, buckets)[:n] == bucket_ids(few, keys, buckets)).all()


def test_uint64_keys_past_int64_are_bucketed_and_stored(tmp_path):
    """A uint64 bucket key hashes its 8 bytes: a batch with values of 2**63 and more is bucketed as
    its rows are one by one (the vectorized path used to cast to int64 and fail with ArrowInvalid,
    so such a table took point writes but refused any larger write)."""
    from flightstore.store import Store

    keys = pa.array([2**63 + i for i in range(40)] + [2**64 - 1, 0, 7], pa.uint64())
    one_by_one = [bucket_ids(pa.table({"k": keys.slice(i, 1)}), ["k"], 7)[0] for i in range(len(keys))]
    assert bucket_ids(pa.table({"k": keys}), ["k"], 7).tolist() == one_by_one
    with Store(tmp_path / "data", fsync=False) as store:
        table = store.create_table("u", pa.schema([("k", pa.uint64()), ("v", pa.int64())]),
                                   primary_key=["k"], options={"bucket.num": 3})
        table.upsert(pa.table({"k": keys, "v": pa.array(range(len(keys)), pa.int64())}))
        assert table.scan_table().num_rows == len(keys)
        assert table.lookup(pa.table({"k": keys.slice(40, 1)})).to_pylist() == [{"k": 2**64 - 1, "v": 40}]
        assert table.lookup(pa.table({"k": keys})).column("v").to_pylist() == list(range(len(keys)))


def test_integer_keys_of_every_width_hash_as_the_reference_over_many_random_values():
    """Every integer type (int64 hashed as it is, the others cast), sliced and chunked arrays:
    murmur3 of the value's 8 little-endian bytes, and buckets as :func:`integer_bucket` computes
    them one row at a time (clients, cluster routing and the stored layout rely on both)."""
    from flightstore.bucketing import integer_bucket

    rng = np.random.default_rng(23)
    for arrow_type in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()):
        dtype = arrow_type.to_pandas_dtype()
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, 3000, endpoint=True, dtype=dtype)
        values[:4] = [info.min, info.max, 0, 1]
        array = pa.array(values, arrow_type)
        expected = [mmh3.hash(struct.pack("<q", int(v)), signed=False) for v in values]
        assert hash_column(array).tolist() == expected
        assert hash_column(array.slice(7, 100)).tolist() == expected[7:107]
        chunked = pa.chunked_array([array.slice(0, 1000), array.slice(1000)])
        assert hash_column(chunked).tolist() == expected
        for buckets in (2, 4, 7, 128):
            for n in (1, 8, 9, 32, 3000):
                ids = bucket_ids(pa.table({"k": array.slice(0, n)}), ["k"], buckets)
                assert ids.dtype == np.int32
                assert ids.tolist() == [integer_bucket([int(v)], buckets) for v in values[:n]]
