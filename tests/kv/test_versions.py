"""KV values of several schema versions (flightstore/kv/versions.py): each value leads with its
version; any mix decodes in order, conformed to the current schema; a KV written before values had
versions is rebuilt from its log once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightstore.errors import CorruptData
from flightstore.kv.encoding import RowCodec
from flightstore.kv.versions import VersionedRowCodec, value_versions

V1 = pa.schema([("id", pa.int64()), ("name", pa.string()), ("q", pa.int16())])
V2 = V1.append(pa.field("note", pa.string()))
V3 = pa.schema([("id", pa.int64()), ("name", pa.string()), ("q", pa.int64()), ("note", pa.string()),
                ("price", pa.float64())])
SCHEMAS = {1: V1, 2: V2, 3: V3}


def _rows(schema, ids):
    data = {"id": ids, "name": [f"n{i}" for i in ids], "q": [i % 100 for i in ids]}
    if "note" in schema.names:
        data["note"] = [None if i % 3 else f"note{i}" for i in ids]
    if "price" in schema.names:
        data["price"] = [i / 4 for i in ids]
    return pa.table(data).cast(schema)


@settings(max_examples=60, deadline=None)
@given(versions=st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=60),
       columns=st.sampled_from([None, ["note", "id"], ["price"], ["q", "name"]]))
def test_any_mix_of_versions_decodes_in_order(versions, columns):
    values = []
    for position, version in enumerate(versions):
        values += VersionedRowCodec(SCHEMAS, version).encode(_rows(SCHEMAS[version], [position]))
    assert value_versions(pa.array(values, pa.binary())).tolist() == versions
    decoded = VersionedRowCodec(SCHEMAS, 3).decode(values, columns)
    expected = []
    for position, version in enumerate(versions):
        row = _rows(V3, [position]).to_pylist()[0]
        if version < 2:
            row["note"] = None
        if version < 3:
            row["price"] = None
        expected.append({c: row[c] for c in (columns or V3.names)})
    assert decoded.to_pylist() == expected
    assert decoded.schema.names == (columns or V3.names)


def test_current_values_take_the_single_version_path_and_unknown_versions_are_corruption():
    codec = VersionedRowCodec(SCHEMAS, 3)
    values = codec.encode(_rows(V3, list(range(40))))
    assert codec.decode(values).equals(_rows(V3, list(range(40))))
    assert all(v[:2] == b"\x03\x00" for v in values)
    alien = RowCodec(V1, 9).encode(_rows(V1, [1]))
    with pytest.raises(CorruptData, match="schema version 9"):
        codec.decode(values + alien)
    assert np.array_equal(value_versions(pa.array([], pa.binary())), np.zeros(0, np.uint16))


def test_kv_of_unversioned_values_is_rebuilt_from_its_log(tmp_path):
    from rocksdict import Options, Rdict

    from flightstore.store import Store
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    with Store(tmp_path / "data") as store:
        table = store.create_table("default.t", schema, primary_key=["id"])
        table.upsert({"id": [1, 2], "v": ["a", "b"]})
        kv_dir = table.kvs[0].directory
    # Rewrite the KV as an older flightstore left it: values without a version, no format marker.
    options = Options(raw_mode=True)
    db = Rdict(str(kv_dir), options=options, column_families={"meta": Options(raw_mode=True)})
    legacy = RowCodec(pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())]))
    for key in list(db.keys()):
        db[key] = legacy.encode(pa.table({"id": [9], "v": ["stale"]}))[0]
    db.get_column_family("meta").delete(b"value_format")
    db.close()
    with Store(tmp_path / "data") as store:
        table = store.table("default.t")
        assert sorted(table.scan_table().to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "v": "a"}, {"id": 2, "v": "b"}]  # rebuilt from the log, not the stale values
        assert table.lookup({"id": [2]}).to_pylist() == [{"id": 2, "v": "b"}]
