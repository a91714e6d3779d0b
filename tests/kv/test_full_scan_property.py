"""A full scan of a primary-key table equals the KV's contents (a lookup of every key ever written)
in every snapshot state: no snapshot (the whole changelog folded), a snapshot and a tail, a tail
longer than the image; with upserts, partial updates and deletes, for every merge engine and for
the three ways changed keys are matched (single integer key, single string key, composite key).
Scans fold the changelog vectorized and never iterate RocksDB here (issue 20, item 10)."""

from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flightstore.errors import InvalidInput, Unsupported
from flightstore.expressions import Comparison
from flightstore.kv.tablet import KvTablet
from flightstore.store import Store

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.int64()), ("note", pa.string())])
KEYS = {"integer": ["k"], "string": ["name"], "composite": ["k", "name"]}
ENGINES = {
    "last_row": {},
    "first_row": {"table.merge-engine": "first_row"},
    "versioned": {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "amount"},
    "aggregation": {"table.merge-engine": "aggregation", "fields.amount.agg": "sum",
                    "fields.note.agg": "last_value"},
}

row = st.fixed_dictionaries({
    "k": st.integers(-4, 4),
    "name": st.sampled_from(["", "a", "b\x00", "zz"]),
    "amount": st.none() | st.integers(-5, 5),
    "note": st.none() | st.sampled_from(["p", "q"]),
})
op = st.one_of(
    st.tuples(st.just("upsert"), st.lists(row, min_size=1, max_size=8)),
    st.tuples(st.just("partial"), st.lists(row, min_size=1, max_size=4)),
    st.tuples(st.just("delete"), st.lists(row, min_size=1, max_size=3)),
    st.tuples(st.just("bulk"), st.integers(5, 60)),  # a run of fresh inserts (a load)
    st.tuples(st.just("snapshot"), st.none()),
)


def _by_key(rows: list[dict], key: list[str]) -> dict:
    out = {tuple(r[c] for c in key): r for r in rows}
    assert len(out) == len(rows), "a key came twice"
    return out


def _kv_contents(table, key: list[str], written: set[tuple]) -> dict:
    """What RocksDB holds: one multi-get lookup of every key ever written."""
    if not written:
        return {}
    keys = pa.table({c: [k[i] for k in written] for i, c in enumerate(key)},
                    schema=pa.schema([SCHEMA.field(c) for c in key]))
    return _by_key(table.lookup(keys).to_pylist(), key)


def _write(table, key: list[str], kind: str, value, serial: list[int]) -> list[dict]:
    if kind == "bulk":
        start = serial[0]
        serial[0] += value
        rows = [{"k": 1000 + i, "name": f"bulk{i}", "amount": i % 7, "note": None} for i in range(start, start + value)]
        table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
        return rows
    data = pa.Table.from_pylist(value, schema=SCHEMA)
    if kind == "upsert":
        table.upsert(data)
    elif kind == "partial":
        columns = [*key, *(c for c in ("amount",) if c not in key)]
        table.upsert(data.select(columns), columns=columns)
    else:
        table.delete(data)
    return value


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=12), buckets=st.sampled_from([1, 2]),
       key_kind=st.sampled_from(sorted(KEYS)))
def test_full_scans_equal_the_kv_in_every_snapshot_state(tmp_path_factory, engine, ops, buckets, key_kind):
    key = KEYS[key_kind]
    written: set[tuple] = set()
    serial = [0]
    with Store(tmp_path_factory.mktemp("scan")) as store:
        table = store.create_table("t", SCHEMA, primary_key=key,
                                   options={"bucket.num": buckets, **ENGINES[engine]})

        def no_rocksdb(*args, **kwargs):
            raise AssertionError("a full scan iterated RocksDB although the changelog serves")

        for kind, value in ops:
            if kind == "snapshot":
                table.snapshot()
                continue
            try:
                rows = _write(table, key, kind, value, serial)
            except (InvalidInput, Unsupported):
                continue  # refused by the engine (nothing written)
            written.update(tuple(r[c] for c in key) for r in rows)
            expected = _kv_contents(table, key, written)
            for kv in table.kvs:
                newest = kv.snapshots.newest
                tail = kv.log.end_offset - (newest.offset if newest is not None else 0)
                event("no snapshot" if newest is None else
                      "tail longer than the image" if tail > newest.rows else "snapshot + tail")
            with mock.patch.object(KvTablet, "scan", no_rocksdb):
                assert _by_key(table.scan_table().to_pylist(), key) == expected
                assert _by_key(table.scan_table(exact=False).to_pylist(), key) == expected
                narrow = table.scan_table([*key, "note"])
                assert _by_key(narrow.to_pylist(), key) == {
                    k: {c: r[c] for c in [*key, "note"]} for k, r in expected.items()}
                filtered = table.scan_table(filter=Comparison("amount", ">", 0))
                assert _by_key(filtered.to_pylist(), key) == {
                    k: r for k, r in expected.items() if r["amount"] is not None and r["amount"] > 0}
                assert table.scan_table(limit=3).num_rows == min(3, len(expected))
        assert table.row_count() == len(_kv_contents(table, key, written))
