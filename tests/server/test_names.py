"""One validator for database and table names, on every way a name comes in (defect 1 of issue 10).

A bulk ingest named ``../../pwn`` once created ``<data dir>/../../pwn-<id>/``. Every route that names
a database or table now answers INVALID_ARGUMENT with a message saying what is wrong (no OSError,
no server path), and creates nothing anywhere; new tables' directories are made from ids only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.catalog import TABLES_DIR, Catalog, read_table_dir
from flightstore.errors import CorruptData, InvalidInput
from flightstore.names import MAX_NAME_BYTES, check_name
from flightstore.server import protocol
from flightstore.store import Store
from tests.server.conftest import RunningServer

BAD_NAMES = ["../../pwn", "", ".", "..", "a/b", "a\\b", "a\x00b", "tab\tle", "x" * 5000,
             "x" * (MAX_NAME_BYTES + 1), "é" * 200]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    server = RunningServer(root / "srv" / "data")
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE kept (id BIGINT)")
    yield server, root
    server.stop()


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _ingest(uri: str, table: str, schema: str | None = None) -> None:
    options = protocol.CommandStatementIngest.TableDefinitionOptions(if_not_exist=1, if_exists=2)
    command = protocol.CommandStatementIngest(table=table, table_definition_options=options)
    if schema is not None:
        command.schema = schema
    data = pa.table({"id": pa.array([1], pa.int64())})
    with flight.FlightClient(uri) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_command(protocol.pack_any(command)),
                                       data.schema)
        writer.write_table(data)
        writer.done_writing()
        reader.read()
        writer.close()


def _refused_cleanly(server, root: Path, call, *, status=pa.ArrowInvalid) -> str:
    """Run ``call``: it fails with ``status`` and changes no file under ``root`` (the server's
    data directory and everything around it); the message carries no path of the server."""
    before, catalog_before = _files(root), server.store.catalog.version
    with pytest.raises(status) as raised:
        call()
    message = str(raised.value)
    assert str(root) not in message and "OSError" not in message and "Errno" not in message, message
    assert _files(root) == before
    assert server.store.catalog.version == catalog_before
    return message.splitlines()[0]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_ingest_with_a_bad_table_name_creates_nothing(running, name) -> None:
    server, root = running
    message = _refused_cleanly(server, root, lambda: _ingest(server.uri, name))
    assert "table name" in message, message
    assert len(message) < 600, message  # a 5,000-character name is not echoed whole


@pytest.mark.parametrize("name", ["../..", "a/b", "x" * 5000], ids=repr)  # "" = the session database
def test_ingest_with_a_bad_database_name_creates_nothing(running, name) -> None:
    server, root = running
    message = _refused_cleanly(server, root, lambda: _ingest(server.uri, "fine", schema=name))
    assert "database name" in message, message


@pytest.mark.parametrize("sql", [
    f"CREATE TABLE {'x' * 5000} (id BIGINT)",
    f"CREATE DATABASE {'d' * 300}",
    'CREATE TABLE "../../pwn" (id BIGINT)',
    'CREATE TABLE ".." (id BIGINT)',
    f"ALTER TABLE kept RENAME TO {'r' * 300}",
    'ALTER TABLE kept RENAME TO "../x"',
])
def test_sql_ddl_with_a_bad_name_is_refused(running, sql) -> None:
    server, root = running
    with flightstore.connect(server.uri) as conn:
        message = _refused_cleanly(server, root, lambda: conn.sql(sql))
    assert "name" in message, message


def test_adbc_ingest_with_a_bad_table_name_creates_nothing(running) -> None:
    """What an ADBC user sees: INVALID_ARGUMENT naming the problem, no traceback, no path."""
    import warnings

    from adbc_driver_flightsql import dbapi
    server, root = running
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = dbapi.connect(server.uri, autocommit=True)
    try:
        with conn.cursor() as cur:
            before = _files(root)
            with pytest.raises(dbapi.Error) as raised:
                cur.adbc_ingest("../../pwn", pa.table({"id": [1]}), mode="create_append")
            message = str(raised.value)
            assert "INVALID_ARGUMENT" in message and "path separator" in message, message
            assert "Traceback" not in message and str(root) not in message, message
            assert _files(root) == before
    finally:
        conn.close()


def test_python_client_refuses_a_bad_table_name_before_sending(running) -> None:
    server, _ = running
    with flightstore.connect(server.uri) as conn:
        for name in ("../../pwn", "", "x" * 5000):
            with pytest.raises(InvalidInput, match="table name"):
                conn.table(name)


def test_custom_write_to_a_bad_table_name_is_refused(running) -> None:
    """A hand-made flightstore command (bypassing the client's check) meets the same validator."""
    from flightstore.server import tickets
    server, root = running
    command = tickets.encode_custom({"op": "append", "table": "../../pwn", "writer_id": "w",
                                     "sequence": 0})

    def put() -> None:
        with flight.FlightClient(server.uri) as client:
            writer, reader = client.do_put(flight.FlightDescriptor.for_command(command),
                                           pa.schema([("id", pa.int64())]))
            writer.done_writing()
            reader.read()
            writer.close()
    assert "table name" in _refused_cleanly(server, root, put)


def test_new_tables_live_in_directories_named_by_id(running) -> None:
    server, _ = running
    directory = read_table_dir(server.store.data_dir, "kept")
    assert directory.parent == server.store.data_dir / TABLES_DIR
    assert "kept" not in directory.name


def test_the_validator_names_the_reason() -> None:
    assert check_name("ok_1") == "ok_1"
    for name, reason in [("", "empty"), ("..", "path component"), ("a/b", "path separator"),
                         ("a\x00b", "control character"), ("x" * 256, "256 bytes"),
                         ("1abc", "not an identifier"), (7, "must be a string")]:
        with pytest.raises(InvalidInput, match=reason):
            check_name(name)


# ---- catalog load ---------------------------------------------------------------------------------
def _edit_catalog(data_dir: Path, edit) -> None:
    path = data_dir / "catalog.json"
    state = json.loads(path.read_text())
    edit(state["databases"])
    path.write_text(json.dumps(state))


def _made_store(data_dir: Path) -> None:
    with Store(data_dir, fsync=False) as store:
        store.create_table("t", pa.schema([("id", pa.int64())])).append({"id": [1, 2]})


@pytest.mark.parametrize("edit,words", [
    (lambda dbs: dbs["default"].__setitem__("../evil", dbs["default"]["t"]), ["../evil", "path separator"]),
    (lambda dbs: dbs.__setitem__("..", {}), ["'..'", "path component"]),
    (lambda dbs: dbs["default"]["t"].__setitem__("dir", "../outside"), ["outside the data directory"]),
    (lambda dbs: dbs["default"]["t"].__setitem__("dir", "/etc"), ["not a path inside"]),
    (lambda dbs: dbs["default"]["t"].__setitem__("dir", "tables/../.."), ["outside the data directory"]),
])
def test_catalog_load_refuses_bad_names_and_escaping_dirs(tmp_path, edit, words) -> None:
    data_dir = tmp_path / "data"
    _made_store(data_dir)
    _edit_catalog(data_dir, edit)
    before = _files(tmp_path)
    with pytest.raises(CorruptData) as raised:
        Store(data_dir, fsync=False)
    for word in words:
        assert word in str(raised.value), str(raised.value)
    assert _files(tmp_path) == before


def test_catalog_refuses_a_symlink_escaping_the_data_dir(tmp_path) -> None:
    data_dir = tmp_path / "data"
    _made_store(data_dir)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", data_dir / "link")
    _edit_catalog(data_dir, lambda dbs: dbs["default"]["t"].__setitem__("dir", "link"))
    with pytest.raises(CorruptData, match="outside the data directory"):
        Catalog(data_dir)


def test_tables_in_old_style_directories_stay_readable(tmp_path) -> None:
    """A catalog written before tables/<id> (``default/<name>-<id>``) still opens and reads."""
    data_dir = tmp_path / "data"
    _made_store(data_dir)
    new_dir = read_table_dir(data_dir, "t")
    old_dir = data_dir / "default" / "t-0123456789ab"
    old_dir.parent.mkdir()
    new_dir.rename(old_dir)
    _edit_catalog(data_dir, lambda dbs: dbs["default"]["t"].__setitem__("dir", "default/t-0123456789ab"))
    with Store(data_dir, fsync=False) as store:
        assert store.table("t").row_count() == 2
        store.drop_table("t")
    assert not old_dir.exists()
