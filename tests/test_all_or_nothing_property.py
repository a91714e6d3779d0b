"""Property: random multi-bucket writes to every merge engine, with failures injected at random
buckets, then restarts: every write is all or nothing and the table always reopens (issue 20
item 2; the single cases are in tests/test_all_or_nothing.py).

Failures are real, never mocked:

* value-dependent ones where the engine has them (the aggregation engine): a DECIMAL(5,2) sum
  that overflows against the stored sum or inside the batch, a retraction that underflows it, and
  bytes rbm32 refuses as a bitmap, placed on a key of a random bucket. last_row, first_row and
  versioned refuse no value in their merge;
* for every engine, a storage failure at a random bucket: that bucket's log segment is made the
  largest file of the table (a padding write), and the process's file-size limit (RLIMIT_FSIZE,
  no root needed) is set to its size while the write runs, so its append fails with EFBIG from
  the kernel, after the buckets before it committed.

The model is the fold of the accepted writes, applied one by one to a one-bucket table of the same
engine (one bucket: no intent, no roll-forward; what is tested here is not in the model). A write
is accepted when it returns or answers WriteIncomplete (recorded: completed, never undone); any
other error must leave the table exactly as it was.
"""

from __future__ import annotations

import decimal
import resource
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyroaring
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.errors import FlightstoreError, WriteIncomplete
from flightstore.store import Store
from tests.kv.fold import fold_changelog, kv_contents

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.decimal128(5, 2)), ("m", pa.int64()), ("t", pa.string()),
                    ("r", pa.binary()), ("v", pa.int64())])
VALUES = ("s", "m", "t", "r", "v")
ENGINES = {
    "last_row": {},
    "first_row": {"table.merge-engine": "first_row"},
    "versioned": {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "v"},
    "aggregation": {"table.merge-engine": "aggregation", "fields.s.agg": "sum", "fields.m.agg": "max",
                    "fields.t.agg": "listagg", "fields.r.agg": "rbm32", "fields.v.agg": "last_value"},
}
PARTIAL = {"last_row": ("s", "m", "t", "r", "v"), "aggregation": ("s", "m", "t", "r", "v")}
RETRACTABLE = {"last_row": ("s", "m", "t", "r", "v"), "aggregation": ("s", "v")}  # partial deletes
BUCKETS = 4
MAX = decimal.Decimal("999.99")

row = st.fixed_dictionaries({
    "k": st.integers(0, 11),
    "s": st.none() | st.integers(0, 5000).map(lambda c: decimal.Decimal(c).scaleb(-2)),
    "m": st.none() | st.integers(-50, 50),
    "t": st.none() | st.sampled_from(["a", "b", "cc", ""]),
    "r": st.none() | st.lists(st.integers(0, 40), max_size=3).map(lambda v: pyroaring.BitMap(v).serialize()),
    "v": st.none() | st.integers(0, 9),
})
op = st.fixed_dictionaries({
    "kind": st.sampled_from(["upsert", "upsert", "partial", "delete"]),
    "columns": st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True),
    "rows": st.lists(row, min_size=2, max_size=10),
    "fail": st.sampled_from([None, "value", "storage"]),
    "where": st.integers(0, BUCKETS - 1),  # which of the touched buckets fails
    "restart": st.booleans(),
})


def state(table) -> dict:
    return kv_contents(table, ["k"])


def write(table, engine: str, kind: str, columns: list[str], data: pa.Table) -> None:
    """One write of ``kind`` (what the engine supports of it; other kinds change to upserts)."""
    if kind == "partial" and engine in PARTIAL:
        target = ["k", *columns]
        table.upsert(data.select(target), columns=target)
    elif kind == "delete" and engine in RETRACTABLE:
        target = ["k", *[c for c in columns if c in RETRACTABLE[engine]]]
        if len(target) == 1:
            table.delete(data.select(["k"]))  # every column: aggregation refuses it (max, listagg)
        else:
            table.delete(data.select(target), columns=target)
    elif kind == "delete":
        table.delete(data.select(["k"]))  # first_row and versioned ignore deletes
    else:
        table.upsert(data)


def poison_value(rows: list[dict], key: int, model: dict, choice: int) -> list[dict]:
    """Rows whose write really fails on values in ``key``'s bucket: the sum overflows DECIMAL(5,2)
    (against the stored sum, or inside the batch), or rbm32 meets bytes that are no bitmap."""
    stored = (model.get((key,)) or {}).get("s")
    if choice == 0:
        return rows + [{"k": key, "r": b"not a bitmap"}]
    if stored is not None and stored > 0:
        return rows + [{"k": key, "s": MAX}]
    return rows + [{"k": key, "s": MAX}, {"k": key, "s": MAX}]


def _active_segment(log) -> Path:
    return max(Path(log.directory).glob("*.log"), key=lambda p: int(p.stem))


def make_full(table, bucket: int, write_bytes: int, pad_key: int) -> tuple[int, dict | None]:
    """Make ``bucket``'s active log segment the largest file the coming write may touch (padding
    it with a write of a fresh key when needed); return the file-size limit that fails its next
    append and the padding row written (None: none needed)."""
    log, _ = table.tablets()[bucket]
    segment = _active_segment(log)
    own = {segment, segment.with_suffix(".index")} | set(Path(table.kvs[bucket].directory).glob("*"))
    others = max(p.stat().st_size for p in table.directory.rglob("*") if p.is_file() and p not in own)
    needed = others + write_bytes + 16 * 1024
    pad = None
    if segment.stat().st_size < needed:
        pad = {"k": pad_key, "t": "x" * (needed - segment.stat().st_size), "v": 0}
        table.upsert(pa.Table.from_pylist([pad], schema=SCHEMA))
    return _active_segment(log).stat().st_size, pad


def attempt(table, twin, engine: str, spec: dict, rows: list[dict], limit: int | None) -> str:
    """Write to the table (under ``limit``), and to the twin if accepted; returns the outcome."""
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    table.writer_sequence("nobody")  # completes a write still pending, so "before" is settled
    before = state(table)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        write(table, engine, spec["kind"], spec["columns"], data)
        outcome = "written"
    except WriteIncomplete:
        outcome = "pending"  # recorded: completed by the next write or the next open
    except (FlightstoreError, OSError):
        outcome = "refused"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    if outcome == "refused":
        assert state(table) == before, "a refused write changed the table"
    else:
        write(twin, engine, spec["kind"], spec["columns"], data)  # the model takes it
        if outcome == "written":
            assert state(table) == state(twin)
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=2, max_size=5), choice=st.integers(0, 1))
def test_every_write_is_all_or_nothing_and_the_table_reopens(tmp_path_factory, engine, ops, choice):
    path = tmp_path_factory.mktemp("aon")
    options = {**ENGINES[engine], "table.log.segment.bytes": 1 << 30}
    twin_store = Store(path / "model", fsync=False)
    store = Store(path / "data", fsync=False)
    try:
        twin = twin_store.create_table("t", SCHEMA, primary_key=["k"], options={**options, "bucket.num": 1})
        store.create_table("t", SCHEMA, primary_key=["k"], options={**options, "bucket.num": BUCKETS})
        pad_key = 1000
        for spec in ops:
            table = store.table("t")
            rows = spec["rows"]
            touched = np.unique(table.buckets_of(pa.Table.from_pylist(rows, schema=SCHEMA)))
            bucket = int(touched[spec["where"] % len(touched)])
            key = next(r["k"] for r in rows if table.buckets_of(pa.table({"k": [r["k"]]}))[0] == bucket)
            limit = None
            if spec["fail"] == "value" and engine == "aggregation":
                rows = poison_value(rows, key, state(twin), choice)
                spec = {**spec, "kind": "upsert"}  # every column written: the poisoned one too
            elif spec["fail"] == "storage":
                while table.buckets_of(pa.table({"k": [pad_key]}))[0] != bucket:
                    pad_key += 1
                limit, pad = make_full(table, bucket, 4 * pa.Table.from_pylist(rows, schema=SCHEMA).nbytes,
                                       pad_key)
                if pad is not None:
                    twin.upsert(pa.Table.from_pylist([pad], schema=SCHEMA))
                    pad_key += 1
            outcome = attempt(table, twin, engine, spec, rows, limit)
            if spec["fail"] == "value" and engine == "aggregation":
                assert outcome == "refused", "the poisoned value did not fail"
            if spec["restart"]:
                store.close()
                store = Store(path / "data", fsync=False)  # the table reopens, completing what is pending
                assert state(store.table("t")) == state(twin)
        store.close()
        store = Store(path / "data", fsync=False)
        table = store.table("t")
        assert state(table) == state(twin)
        assert fold_changelog(table, ["k"]) == state(twin)  # the changelog folds to it too
        assert table.row_count() == len(state(twin))
        intent = table.directory / "intent"
        assert not intent.exists() or not intent.read_bytes()  # nothing left to complete
    finally:
        store.close()
        twin_store.close()
