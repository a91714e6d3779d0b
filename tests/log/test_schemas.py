"""Schema epochs of a log (flightstore/log/schemas.py): records written under older schema versions
read back conformed to the current one, by offset, after reopening and through every read option."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from flightstore.errors import CorruptData
from flightstore.expressions import Comparison, IsNull
from flightstore.log import LogTablet
from flightstore.log.schemas import EPOCHS_FILE

V1 = pa.schema([("id", pa.int64()), ("v", pa.int16())])
V2 = pa.schema([("id", pa.int64()), ("v", pa.int16()), ("note", pa.string())])
V3 = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("note", pa.string()), ("w", pa.float64())])


def _open(directory, version, compression="NONE"):
    schemas = {1: V1, 2: V2, 3: V3}
    return LogTablet(directory, schemas[version], schema_version=version, past_schemas=schemas,
                     compression=compression, statistics_columns=("*",))


@pytest.mark.parametrize("compression", ["NONE", "ZSTD"])
def test_old_records_read_with_nulls_and_widened_types(tmp_path, compression):
    log = _open(tmp_path, 1, compression)
    log.append(pa.table({"id": [1, 2], "v": pa.array([10, 20], pa.int16())}))
    log.evolve(V2, 2)
    log.append(pa.table({"id": [3], "v": pa.array([30], pa.int16()), "note": ["c"]}))
    log.evolve(V3, 3)
    log.append(pa.table({"id": [4], "v": [2 ** 40], "note": ["d"], "w": [0.5]}))
    log.close()
    assert json.loads((tmp_path / EPOCHS_FILE).read_text()) == [[1, 0], [2, 2], [3, 3]]

    log = _open(tmp_path, 3, compression)
    rows = [r for b in log.read(0) for r in b.batch.to_pylist()]
    assert rows == [{"id": 1, "v": 10, "note": None, "w": None}, {"id": 2, "v": 20, "note": None, "w": None},
                    {"id": 3, "v": 30, "note": "c", "w": None}, {"id": 4, "v": 2 ** 40, "note": "d", "w": 0.5}]
    assert all(b.batch.schema == V3 for b in log.read(0))
    only_new = [r for b in log.read(0, columns=["w", "id"]) for r in b.batch.to_pylist()]
    assert only_new == [{"w": None, "id": 1}, {"w": None, "id": 2}, {"w": None, "id": 3}, {"w": 0.5, "id": 4}]
    filtered = [b.batch.column("id").to_pylist() for b in log.read(0, filter=IsNull("note").bind(V3))]
    assert filtered == [[1, 2]]
    big = [b.batch.column("id").to_pylist() for b in log.read(0, filter=Comparison("v", ">", 25).bind(V3))]
    assert big == [[3], [4]]
    assert [b.batch.num_rows for b in log.read(1, to_offset=3)] == [1, 1]
    log.close()


def test_epochs_survive_reopen_at_an_older_catalog_version_only_as_corruption(tmp_path):
    log = _open(tmp_path, 1)
    log.append(pa.table({"id": [1], "v": pa.array([1], pa.int16())}))
    log.evolve(V2, 2)
    log.close()
    with pytest.raises(CorruptData, match="schema version 2 but the catalog knows version 1"):
        _open(tmp_path, 1)


def test_a_version_committed_while_the_log_was_closed_starts_at_its_end(tmp_path):
    log = _open(tmp_path, 1)
    log.append(pa.table({"id": [1, 2], "v": pa.array([1, 2], pa.int16())}))
    log.close()
    log = _open(tmp_path, 3)  # two ALTERs committed (a crash before the log followed, or closed)
    assert json.loads((tmp_path / EPOCHS_FILE).read_text()) == [[1, 0], [3, 2]]
    log.append(pa.table({"id": [3], "v": [3], "note": ["x"], "w": [1.0]}))
    assert [r["note"] for b in log.read(0) for r in b.batch.to_pylist()] == [None, None, "x"]
    log.close()


def test_a_log_that_predates_epochs_holds_version_one(tmp_path):
    log = LogTablet(tmp_path, V1)
    log.append(pa.table({"id": [1], "v": pa.array([1], pa.int16())}))
    log.close()
    (tmp_path / EPOCHS_FILE).unlink()  # written before schema versions existed
    log = _open(tmp_path, 2)
    assert [r for b in log.read(0) for r in b.batch.to_pylist()] == [{"id": 1, "v": 1, "note": None}]
    log.close()
    empty = _open(tmp_path / "fresh", 3)  # a new log at version 3: nothing older to read
    assert json.loads((tmp_path / "fresh" / EPOCHS_FILE).read_text()) == [[3, 0]]
    empty.close()
