"""Snapshot reads are exact: at every offset, the rows from (image + changelog tail) equal a plain
Python model of the writes, for random upserts, partial updates and deletes on a composite key,
with KV snapshots taken at random moments."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.store import Store

SCHEMA = pa.schema([("a", pa.int32()), ("s", pa.string()), ("x", pa.int64()), ("y", pa.string())])
# A composite key (merged through encoded keys), a single integer key and a single string key (the
# integer one through a binary search of the image's sorted key column).
KEYS = {"composite": ("a", "s"), "integer": ("a",), "string": ("s",)}

row = st.fixed_dictionaries({
    "a": st.integers(-3, 3),
    "s": st.sampled_from(["", "a", "a\x00", "b", "zz"]),
    "x": st.none() | st.integers(-10, 10),
    "y": st.none() | st.sampled_from(["p", "q", ""]),
})
op = st.tuples(
    st.sampled_from(["upsert", "upsert", "delete", "snapshot"]),
    st.none() | st.sampled_from([("x",), ("y",)]),
    st.lists(row, min_size=1, max_size=6),
)


def apply(state: dict, key_columns, kind: str, columns, rows: list[dict]) -> None:
    for r in rows:
        key = tuple(r[c] for c in key_columns)
        if kind == "upsert":
            if columns is None:
                state[key] = dict(r)
            else:
                other = {c: None for c in SCHEMA.names if c not in key_columns}
                base = state.get(key, {**{c: r[c] for c in key_columns}, **other})
                state[key] = {**base, **{c: r[c] for c in columns}}
        elif key in state:
            if columns is None:
                del state[key]
            else:
                left = {**state[key], **{c: None for c in columns}}
                if all(left[c] is None for c in SCHEMA.names if c not in key_columns):
                    del state[key]
                else:
                    state[key] = left


@pytest.mark.parametrize("key_kind", sorted(KEYS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=14), buckets=st.sampled_from([1, 2]),
       retained=st.sampled_from([1, 2]))
def test_rows_at_every_offset_and_full_scans_equal_the_model(tmp_path_factory, key_kind, ops, buckets,
                                                             retained):
    key = KEYS[key_kind]

    def as_dict(batches) -> dict:
        rows = [r for b in batches for r in b.to_pylist()]
        by_key = {tuple(r[c] for c in key): r for r in rows}
        assert len(by_key) == len(rows), "a key came twice"
        return by_key

    path = tmp_path_factory.mktemp("snap")
    model: dict = {}
    history = []  # (end offsets, model) after every write
    with Store(path) as store:
        table = store.create_table("t", SCHEMA, primary_key=list(key),
                                   options={"bucket.num": buckets, "kv.snapshot.num-retained": retained})
        for kind, columns, rows in ops:
            if kind == "snapshot":
                table.snapshot()
                continue
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            target = None if columns is None else [*key, *(c for c in columns if c not in key)]
            part = data.select(target) if target else data
            if kind == "upsert":
                table.upsert(part, columns=target)
            else:
                table.delete(part, columns=target)
            apply(model, key, kind, columns, rows)
            history.append((table.end_offsets(), dict(model)))
            assert as_dict(table.scan(None)) == model  # image + tail (or RocksDB) now
        bucket_of = {key: int(table.buckets_of(pa.Table.from_pylist([row], schema=SCHEMA))[0])
                     for _, state in history for key, row in state.items()}
        for offsets, state in history:
            for bucket, at in offsets.items():
                expected = {k: r for k, r in state.items() if bucket_of[k] == bucket}
                assert as_dict(table.rows_at(bucket, at)) == expected, (bucket, at)
        assert as_dict(b for kv in table.kvs for b in kv.scan()) == model  # RocksDB agrees
    with Store(path) as store:  # and after a reopen
        assert as_dict(store.table("t").scan(None)) == model
