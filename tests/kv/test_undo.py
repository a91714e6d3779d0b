"""Undo takes back one writer's batches after a checkpoint and nothing else (flightstore/kv/undo.py).

Property tests run random interleavings of several writers, undo any of them to any checkpoint and
compare the table with a Python fold of the history without the undone batches:

* on an aggregation table of invertible functions (sum, product), undo always succeeds and equals
  that fold, and replaying the undone batches afterwards equals the fold with them at the end;
* on a last-row table, undo succeeds exactly when no other writer changed a key the undone writer
  changed after it (and then equals the fold), otherwise it refuses, naming a key, and writes
  nothing.

The histories avoid writes that change nothing (they leave no changelog record, so undo cannot see
them; see the module docstring): sums add non-zero values, products multiply by |v| >= 2, upserts
write values never written before.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from flightstore import changetype
from flightstore.errors import InvalidInput
from flightstore.kv import undo as undo_module
from flightstore.store import Store
from tests.kv.fold import fold_changelog, kv_contents

WRITERS = ("A", "B", "C")
KEYS = 4

AGG_SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("p", pa.int64()), ("q", pa.int64())])
AGG_OPTIONS = {"table.merge-engine": "aggregation", "fields.n.agg": "sum", "fields.p.agg": "product",
               "fields.q.agg": "sum", "bucket.num": "2"}
AGG_COLUMN_SETS = (("k", "n", "p", "q"), ("k", "n"), ("k", "p", "q"))


def _number(column: str):
    if column == "p":
        return st.sampled_from([2, 3, -2, -3])
    return st.integers(1, 9)


@st.composite
def agg_row(draw, columns):
    """A row with at least one value (a write that changes nothing leaves no trace)."""
    written = [c for c in columns if c != "k"]
    certain = draw(st.sampled_from(written))
    values = {c: draw(_number(c) if c == certain else st.one_of(st.none(), _number(c)))
              for c in written}
    return {"k": draw(st.integers(0, KEYS - 1)), **values}


@st.composite
def agg_history(draw):
    batches = []
    for _ in range(draw(st.integers(1, 9))):
        columns = draw(st.sampled_from(AGG_COLUMN_SETS))
        batches.append((draw(st.sampled_from(WRITERS)), columns,
                        draw(st.lists(agg_row(columns), min_size=1, max_size=3))))
    return batches


def _numbered(history):
    """(writer, sequence, columns, rows) in history order, sequences counted per writer."""
    counters = {w: itertools.count() for w in WRITERS}
    return [(w, next(counters[w]), columns, rows) for w, columns, rows in history]


def _agg_fold(batches) -> dict:
    state: dict = {}
    for _, _, columns, rows in batches:
        for row in rows:
            current = state.setdefault(row["k"], {"k": row["k"], "n": None, "p": None, "q": None})
            for column in columns[1:]:
                value = row[column]
                if value is None:
                    continue
                old = current[column]
                current[column] = value if old is None else old * value if column == "p" else old + value
    return state


def _write_agg(table, writer, sequence, columns, rows) -> None:
    """Unwritten columns travel as nulls, which an aggregation skips (a partial update in effect:
    a real partial update would claim its columns for its writer, see kv/ownership.py)."""
    data = pa.Table.from_pylist([{c: r.get(c) if c in columns else None for c in AGG_SCHEMA.names}
                                 for r in rows], schema=AGG_SCHEMA)
    table.upsert(data, writer_id=writer, sequence=sequence)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agg_history(), st.sampled_from(WRITERS), st.integers(-1, 8), st.booleans())
def test_undo_on_sums_and_products_equals_the_fold_without_the_undone_batches(
        tmp_path_factory, history, undone, checkpoint, replay):
    batches = _numbered(history)
    ours = [b for b in batches if b[0] == undone]
    assume(ours)
    checkpoint = min(checkpoint, ours[-1][1])
    with Store(tmp_path_factory.mktemp("undo")) as store:
        table = store.create_table("t", AGG_SCHEMA, primary_key=["k"], options=AGG_OPTIONS)
        for batch in batches:
            _write_agg(table, *batch)
        kept = [b for b in batches if not (b[0] == undone and b[1] > checkpoint)]
        table.undo(undone, checkpoint)
        assert {r["k"]: r for r in table.scan_table().to_pylist()} == _agg_fold(kept)
        assert table.writer_sequence(undone) == (None if checkpoint < 0 else checkpoint)
        assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])
        if replay:  # the restarted job writes its batches again, after everything else
            redo = [b for b in ours if b[1] > checkpoint]
            for batch in redo:
                _write_agg(table, *batch)
            assert {r["k"]: r for r in table.scan_table().to_pylist()} == _agg_fold(kept + redo)


# ---- last-row tables: restore or refuse ---------------------------------------------------------

ROW_SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.int64()), ("y", pa.int64())])


PARTIAL_COLUMN = {"A": "x", "B": "y"}  # partial updates own their columns (kv/ownership.py)


@st.composite
def row_history(draw):
    """Writes of unique values (so every upsert changes its row), partial updates of the writer's
    own column, and deletes."""
    fresh = itertools.count(1)
    batches = []
    for _ in range(draw(st.integers(1, 9))):
        writer = draw(st.sampled_from(WRITERS))
        kinds = ["full", "delete"] + (["partial"] if writer in PARTIAL_COLUMN else [])
        kind = draw(st.sampled_from(kinds))
        keys = draw(st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=3, unique=True))
        if kind == "delete":
            rows = [{"k": k} for k in keys]
        elif kind == "partial":
            rows = [{"k": k, PARTIAL_COLUMN[writer]: next(fresh)} for k in keys]
        else:
            rows = [{"k": k, "x": next(fresh), "y": next(fresh)} for k in keys]
        batches.append((writer, kind, rows))
    return batches


def _row_step(state: dict, kind: str, rows) -> set:
    """Apply one batch to a last-row state; return the keys it changed."""
    changed = set()
    for row in rows:
        k = row["k"]
        if kind == "delete":
            if state.pop(k, None) is not None:
                changed.add(k)
            continue
        old = state.get(k)
        new = dict(old or {"k": k, "x": None, "y": None})
        new.update(row)
        if new != old:
            state[k] = new
            changed.add(k)
    return changed


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_history(), st.sampled_from(WRITERS), st.integers(-1, 8))
def test_undo_on_a_last_row_table_restores_or_refuses_as_defined(tmp_path_factory, history, undone,
                                                                  checkpoint):
    counters = {w: itertools.count() for w in WRITERS}
    batches = [(w, next(counters[w]), kind, rows) for w, kind, rows in history]
    ours = [b for b in batches if b[0] == undone]
    assume(ours)
    checkpoint = min(checkpoint, ours[-1][1])
    is_undone = [w == undone and s > checkpoint for w, s, _, _ in batches]
    # The model: which keys the undone batches changed, and whether another writer changed one
    # of them after that; writes that change nothing must stay so without the undone batches.
    with_all, without, first_undone, contested = {}, {}, {}, False
    for step, ((_, _, kind, rows), gone) in enumerate(zip(batches, is_undone)):
        changed = _row_step(with_all, kind, rows)
        if gone:
            for k in changed:
                first_undone.setdefault(k, step)
            continue
        contested |= any(k in first_undone for k in changed)
        assume(_row_step(without, kind, rows) <= changed)  # no write is invisible in the log
    with Store(tmp_path_factory.mktemp("undo")) as store:
        table = store.create_table("t", ROW_SCHEMA, primary_key=["k"], options={"bucket.num": "2"})
        for writer, sequence, kind, rows in batches:
            if kind == "delete":
                table.delete(pa.table({"k": pa.array([r["k"] for r in rows], pa.int64())}),
                             writer_id=writer, sequence=sequence)
            else:
                data = pa.Table.from_pylist(rows)
                table.upsert(data.cast(pa.schema([ROW_SCHEMA.field(c) for c in data.column_names])),
                             None if kind == "full" else data.column_names, writer_id=writer,
                             sequence=sequence)
        before, offsets = kv_contents(table, ["k"]), table.end_offsets()
        event("refused" if contested else "restored")
        if contested:
            with pytest.raises(InvalidInput, match=f"cannot undo writer '{undone}': key"):
                table.undo(undone, checkpoint)
            assert kv_contents(table, ["k"]) == before and table.end_offsets() == offsets
            return
        table.undo(undone, checkpoint)
        assert {k[0]: r for k, r in kv_contents(table, ["k"]).items()} == without
        assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])


# ---- crashes, refusals ------------------------------------------------------------------------

def _sums(store):
    table = store.create_table("s", AGG_SCHEMA, primary_key=["k"], options=AGG_OPTIONS)

    def add(writer: str, sequence: int, k: int, n: int) -> None:
        _write_agg(table, writer, sequence, ("k", "n"), [{"k": k, "n": n}])
    return table, add


def _n(table) -> dict:
    return {r["k"]: r["n"] for r in table.scan_table().to_pylist()}


def test_a_crash_between_restore_and_fence_does_not_retract_twice(store, monkeypatch):
    table, add = _sums(store)
    add("A", 0, 1, 10)
    add("A", 1, 1, 5)
    add("B", 0, 1, 100)
    add("A", 2, 2, 7)
    real = undo_module._settle

    def crash(*args):
        raise RuntimeError("killed before the fence")

    monkeypatch.setattr(undo_module, "_settle", crash)
    with pytest.raises(RuntimeError):
        table.undo("A", 0)
    assert _n(table) == {1: 110}  # the restore landed (and is in the changelog)
    monkeypatch.setattr(undo_module, "_settle", real)
    assert table.undo("A", 0) == 0  # the restore record is the fence: nothing is taken twice
    assert _n(table) == {1: 110}
    with pytest.raises(InvalidInput, match="already undone to sequence 0"):
        table.undo("A", -1)  # an earlier checkpoint than the crashed undo's
    add("A", 1, 1, 1)  # the replay continues after the checkpoint
    assert _n(table) == {1: 111}
    store.close()
    with Store(store.data_dir) as again:  # the restore and the fence survive a restart
        reopened = again.table("s")
        assert _n(reopened) == {1: 111} and reopened.writer_sequence("A") == 1


def test_refusals_name_the_key_and_field_and_write_nothing(store):
    table = store.create_table("m", AGG_SCHEMA, primary_key=["k"],
                               options={**AGG_OPTIONS, "fields.q.agg": "max"})
    _write_agg(table, "A", 0, ("k", "q"), [{"k": 3, "q": 5}])
    _write_agg(table, "B", 0, ("k", "q"), [{"k": 3, "q": 9}])
    with pytest.raises(InvalidInput, match=r"key\(s\) 3 .* field\(s\) 'q' \(max\)"):
        table.undo("A", -1)
    assert _n(table) == {3: None} and table.scan_table().column("q").to_pylist() == [9]
    zero, add = _sums(store)
    _write_agg(zero, "B", 0, ("k", "p"), [{"k": 1, "p": 3}])
    _write_agg(zero, "A", 0, ("k", "p"), [{"k": 1, "p": 0}])  # 3 x 0: the 3 is gone for good
    add("B", 1, 1, 1)
    with pytest.raises(InvalidInput, match="a factor of zero"):
        zero.undo("A", -1)
    assert zero.scan_table().to_pylist() == [{"k": 1, "n": 1, "p": 0, "q": None}]


def test_undo_of_a_writer_without_state_does_nothing(store):
    table, add = _sums(store)
    add("B", 0, 1, 1)
    assert table.undo("nobody", -1) == 0
    assert _n(table) == {1: 1}
    changelog = [r.writer_id for log in table.logs for r in log.read(0)]
    assert not any(w.startswith(undo_module.UNDO_WRITER_PREFIX) for w in changelog if w)


def test_undo_reads_only_the_records_since_the_writers_first_undone_batch(store, monkeypatch):
    table, add = _sums(store)
    for sequence in range(50):
        add("B", sequence, sequence % KEYS, 1)
    add("A", 0, 1, 1)
    add("A", 1, 2, 1)
    loaded = []
    real = type(table.logs[0]).read

    def counting(self, from_offset=0, **kwargs):
        for record in real(self, from_offset, **kwargs):
            if kwargs.get("columns") != []:
                loaded.append(record)
            yield record

    monkeypatch.setattr(type(table.logs[0]), "read", counting)
    table.undo("A", 0)
    assert len(loaded) == 1  # A's batch 1 only; the 50 earlier batches were walked header-only
    assert np.array_equal(sorted(_n(table).items()), sorted({0: 13, 1: 14, 2: 12, 3: 12}.items()))
    assert changetype.CHANGE_TYPE_COLUMN in loaded[0].batch.schema.names
