"""Each merge engine and delete behavior against its Fluss semantics, plus the shared invariant."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightstore import changetype
from flightstore.errors import InvalidInput
from tests.kv.fold import fold_changelog, kv_contents

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("ver", pa.int64())])


def rows(*tuples):
    return pa.Table.from_pylist([dict(zip(("k", "v", "ver"), t)) for t in tuples], schema=SCHEMA)


def changes(table):
    out = []
    for log in table.logs:
        for record in log.read(0):
            for r in pa.Table.from_batches([record.batch]).to_pylist():
                out.append((changetype.SHORT_STRINGS[r["_change_type"]], r["k"], r["v"]))
    return out


ENGINES = {
    "last_row": {},
    "first_row": {"table.merge-engine": "first_row"},
    "versioned": {"table.merge-engine": "versioned", "table.merge-engine.versioned.ver-column": "ver"},
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_keeps_kv_equal_to_changelog_fold(store, engine):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=ENGINES[engine])
    table.upsert(rows((1, "a", 1), (2, "b", 1), (1, "c", 2)))
    table.upsert(rows((2, "d", 0), (3, "e", None), (1, "f", 2)))
    table.delete(rows((3, None, None)))
    assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])


def test_last_row_replaces_and_emits_update_pairs(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"])
    table.upsert(rows((1, "a", 1)))
    table.upsert(rows((1, "b", 1), (1, "c", 1)))  # duplicates in one batch fold to the last
    table.delete(rows((1, None, None)))
    assert changes(table) == [("+I", 1, "a"), ("-U", 1, "a"), ("+U", 1, "c"), ("-D", 1, "c")]
    assert table.row_count() == 0



def test_a_write_into_an_empty_bucket_reads_no_stored_row_and_a_later_one_does(store):
    """An empty bucket (a fresh table, or one emptied by deletes) answers "not found" for every
    key without a RocksDB multi-get (the bulk load's and the lake backfill's sink write); the
    changelog and rows are the same as the general path's."""
    table = store.create_table("t", SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
    kv = table.kvs[0]
    reads = []
    general = kv._multi_get
    kv._multi_get = lambda keys, columns=None: reads.append(len(keys)) or general(keys, columns)
    table.upsert(rows((1, "a", 1), (2, "b", 1), (1, "c", 1)))
    assert reads == []  # the bucket was empty
    table.upsert(rows((2, "d", 1), (3, "e", 1)))
    assert reads == [2]  # it holds rows now: both keys looked up, 2 found
    table.delete(rows((1, None, None), (2, None, None), (3, None, None)))
    assert table.row_count() == 0
    reads.clear()
    table.upsert(rows((3, "f", 1)))
    assert reads == []
    assert changes(table) == [("+I", 1, "c"), ("+I", 2, "b"), ("-U", 2, "b"), ("+U", 2, "d"), ("+I", 3, "e"),
                              ("-D", 1, "c"), ("-D", 2, "d"), ("-D", 3, "e"), ("+I", 3, "f")]
    assert table.lookup({"k": [1, 2, 3]}).to_pylist() == [{"k": 3, "v": "f", "ver": 1}]

def test_wal_image_omits_update_before(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options={"table.changelog.image": "WAL"})
    table.upsert(rows((1, "a", 1)))
    table.upsert(rows((1, "b", 1)))
    assert changes(table) == [("+I", 1, "a"), ("+U", 1, "b")]


def test_partial_update_keeps_other_columns_and_partial_delete_removes_when_empty(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"])
    table.upsert(rows((1, "a", 7)))
    table.upsert(pa.table({"k": [1], "v": ["b"]}), columns=["k", "v"])
    assert table.lookup({"k": [1]}).to_pylist() == [{"k": 1, "v": "b", "ver": 7}]
    table.upsert(pa.table({"k": [2], "ver": [5]}), columns=["k", "ver"])
    assert table.lookup({"k": [2]}).to_pylist() == [{"k": 2, "v": None, "ver": 5}]
    table.delete(pa.table({"k": [1], "v": ["ignored"]}), columns=["k", "v"])
    assert table.lookup({"k": [1]}).to_pylist() == [{"k": 1, "v": None, "ver": 7}]
    table.delete(pa.table({"k": [1], "ver": [0]}), columns=["k", "ver"])
    assert table.lookup({"k": [1]}).num_rows == 0
    assert table.row_count() == 1


def test_first_row_keeps_first_and_is_insert_only(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=ENGINES["first_row"])
    table.upsert(rows((1, "a", 1), (1, "b", 2)))
    table.upsert(rows((1, "c", 3), (2, "d", 1)))
    table.delete(rows((1, None, None)))  # ignored, as Fluss does
    assert kv_contents(table, ["k"]) == {(1,): {"k": 1, "v": "a", "ver": 1}, (2,): {"k": 2, "v": "d", "ver": 1}}
    assert {c[0] for c in changes(table)} == {"+I"}
    with pytest.raises(InvalidInput, match="partial"):
        table.upsert(pa.table({"k": [1], "v": ["x"]}), columns=["k", "v"])


def test_versioned_keeps_greater_or_equal_version_and_ignores_nulls(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options=ENGINES["versioned"])
    table.upsert(rows((1, "v1", 1000)))
    table.upsert(rows((1, "v2", 999)))
    assert table.lookup({"k": [1]}).column("v").to_pylist() == ["v1"]
    table.upsert(rows((1, "v3", 1000)))  # equal version replaces
    assert table.lookup({"k": [1]}).column("v").to_pylist() == ["v3"]
    table.upsert(rows((1, "null-version", None)))
    assert table.lookup({"k": [1]}).column("v").to_pylist() == ["v3"]
    # In one batch: the last row with the greatest version wins.
    table.upsert(rows((1, "a", 2000), (1, "b", 3000), (1, "c", 3000), (1, "d", 2500)))
    assert table.lookup({"k": [1]}).column("v").to_pylist() == ["c"]
    table.delete(rows((1, None, None)))  # ignored
    assert table.row_count() == 1


@pytest.mark.parametrize("engine", ["first_row", "versioned"])
def test_first_row_and_versioned_cannot_allow_deletes(store, engine):
    with pytest.raises(InvalidInput, match="cannot allow deletes"):
        store.create_table("t", SCHEMA, primary_key=["k"],
                           options={**ENGINES[engine], "table.delete.behavior": "allow"})


def test_delete_behavior_ignore_and_disable(store):
    ignore = store.create_table("ti", SCHEMA, primary_key=["k"], options={"table.delete.behavior": "ignore"})
    ignore.upsert(rows((1, "a", 1)))
    ignore.delete(rows((1, None, None)))
    assert ignore.row_count() == 1
    disable = store.create_table("td", SCHEMA, primary_key=["k"], options={"table.delete.behavior": "disable"})
    disable.upsert(rows((1, "a", 1)))
    with pytest.raises(InvalidInput, match="disables deletes"):
        disable.delete(rows((1, None, None)))
    assert disable.row_count() == 1
    assert len(changes(disable)) == 1
