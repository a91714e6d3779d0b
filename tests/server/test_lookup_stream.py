"""The lookup stream (DoExchange) against a real server: answers equal SELECT ... WHERE, grants
hold on an open stream, a handle follows ALTER TABLE, shutdown ends idle streams, bad messages
are refused, and a stream broken by a killed server is retried or fails clearly."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyarrow import flight

import flightstore
from flightstore.lookup_stream import StreamBroken
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from flightstore.wire import lookups as wire
from tests.forked_server import ForkedServerProcess
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

TIMEOUT = 60
ROWS = 60
GROUPS = 6
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]


def _sql_literal(value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """One server for the module: a single-key table with NULLs in its other columns, a
    composite-key table (bucket key ``g``: prefix lookups) and a partitioned one."""
    running = RunningServer(tmp_path_factory.mktemp("lookups") / "data")
    with flightstore.connect(running.uri, timeout=TIMEOUT) as conn:
        conn.sql("CREATE TABLE single (id BIGINT, name STRING, amount DOUBLE, flag BOOLEAN, "
                 "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '3')")
        conn.table("single").upsert(pa.table({
            "id": list(range(ROWS)),
            "name": [None if i % 4 == 0 else f"n{i}" for i in range(ROWS)],
            "amount": [None if i % 5 == 0 else i * 0.5 for i in range(ROWS)],
            "flag": [None if i % 3 == 0 else i % 2 == 0 for i in range(ROWS)]}))
        conn.sql("CREATE TABLE composite (g INT, id BIGINT, v STRING, PRIMARY KEY (g, id) NOT ENFORCED) "
                 "WITH ('bucket.num' = '4', 'bucket.key' = 'g')")
        conn.table("composite").upsert(pa.table({
            "g": pa.array([i % GROUPS for i in range(ROWS)], pa.int32()), "id": list(range(ROWS)),
            "v": [None if i % 7 == 0 else f"v{i}" for i in range(ROWS)]}))
        conn.sql("CREATE TABLE part (dt STRING, id BIGINT, v BIGINT, PRIMARY KEY (dt, id) NOT ENFORCED) "
                 "PARTITIONED BY (dt) WITH ('bucket.num' = '2')")
        conn.table("part").upsert(pa.table({
            "dt": [DAYS[i % len(DAYS)] for i in range(ROWS)], "id": list(range(ROWS)),
            "v": [None if i % 6 == 0 else i for i in range(ROWS)]}))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def conn(loaded):
    with flightstore.connect(loaded.uri, timeout=TIMEOUT) as connection:
        yield connection


def _where(keys: dict, i: int) -> str:
    return " AND ".join(f"{c} = {_sql_literal(values[i])}" for c, values in keys.items())


def _selected(conn, table: str, keys: dict, columns: list[str] | None) -> pa.Table:
    """What SELECT ... WHERE answers for each key row, in key order."""
    projection = ", ".join(columns) if columns else "*"
    n = len(next(iter(keys.values())))
    parts = [conn.sql(f"SELECT {projection} FROM {table} WHERE {_where(keys, i)}") for i in range(n)]
    return pa.concat_tables(parts) if parts else None


def _sorted_rows(table: pa.Table) -> list:
    return sorted(table.to_pylist(), key=repr)


ids = st.lists(st.integers(-5, ROWS + 5), min_size=1, max_size=8, unique=True)
columns_of_single = st.sampled_from([None, ["name"], ["amount", "id"], ["flag", "name", "amount"]])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=ids, columns=columns_of_single)
def test_lookups_answer_what_select_where_answers(conn, keys, columns):
    """Random present and missing keys, NULLs in the other columns, any projection: the stream's
    rows (in key order), the lookuper's per-key rows and SELECT ... WHERE are the same."""
    streamed = conn.table("single").lookup({"id": keys}, columns)
    expected = _selected(conn, "single", {"id": keys}, columns)
    assert streamed.schema.names == expected.schema.names
    assert streamed.to_pylist() == expected.to_pylist()
    with conn.table("single").lookuper(columns=columns, options={"client.lookup.batch-timeout": "2ms"}) as lk:
        answers = [lk.lookup_async(k) for k in keys]
        per_key = [future.result(TIMEOUT) for future in answers]
    for key, rows in zip(keys, per_key):
        assert rows.to_pylist() == _selected(conn, "single", {"id": [key]}, columns).to_pylist()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.integers(-1, GROUPS), st.integers(-2, ROWS + 2)), min_size=1,
                      max_size=6, unique=True),
       groups=st.lists(st.integers(-1, GROUPS), min_size=1, max_size=4, unique=True),
       limit=st.one_of(st.none(), st.integers(1, 15)))
def test_composite_and_prefix_lookups_answer_what_select_where_answers(conn, pairs, groups, limit):
    table = conn.table("composite")
    keys = {"g": [g for g, _ in pairs], "id": [i for _, i in pairs]}
    assert table.lookup(keys).to_pylist() == _selected(conn, "composite", keys, None).to_pylist()
    found = table.prefix_lookup({"g": groups}, ["id", "v"], limit=limit)
    expected = _selected(conn, "composite", {"g": groups}, ["id", "v"])
    if limit is None:
        assert _sorted_rows(found) == _sorted_rows(expected)
    else:  # the first `limit` rows, prefix by prefix: a subset of the answer, as many as it allows
        assert found.num_rows == min(limit, expected.num_rows)
        assert all(row in expected.to_pylist() for row in found.to_pylist())
    with table.lookuper(prefix=["g"], columns=["id", "v"],
                        options={"client.lookup.batch-timeout": "2ms"}) as lk:
        answers = {g: lk.lookup_async(g) for g in groups}
        for g, future in answers.items():
            assert _sorted_rows(future.result(TIMEOUT)) == \
                _sorted_rows(_selected(conn, "composite", {"g": [g]}, ["id", "v"]))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.sampled_from(DAYS + ["2026-02-01"]), st.integers(-2, ROWS + 2)),
                      min_size=1, max_size=6, unique=True))
def test_partitioned_lookups_answer_what_select_where_answers(conn, pairs):
    keys = {"dt": [d for d, _ in pairs], "id": [i for _, i in pairs]}
    assert conn.table("part").lookup(keys).to_pylist() == _selected(conn, "part", keys, None).to_pylist()
    with conn.table("part").lookuper(options={"client.lookup.batch-timeout": "2ms"}) as lk:
        answers = [lk.lookup_async({"id": i, "dt": d}) for d, i in pairs]
        for (d, i), future in zip(pairs, answers):
            assert future.result(TIMEOUT).to_pylist() == \
                _selected(conn, "part", {"dt": [d], "id": [i]}, None).to_pylist()


def test_lookups_travel_on_one_stream_without_new_calls(loaded, conn):
    """Many lookups, one DoExchange: the server's RPC counter moves by the stream's one call."""
    table = conn.table("single")
    table.lookup({"id": [1]})  # the stream is open
    calls = loaded.server.metrics.rpcs.collect()[0].samples
    before = sum(s.value for s in calls if s.name.endswith("_total"))
    for key in range(30):
        assert table.lookup({"id": [key]}).column("id").to_pylist() == [key]
        table.prefix_lookup({"id": [key]}, ["name"])
    after = sum(s.value for s in loaded.server.metrics.rpcs.collect()[0].samples if s.name.endswith("_total"))
    assert after == before
    assert len(loaded.server.lookup_streams) >= 1


def test_bad_keys_and_refusals_keep_their_errors(conn):
    table = conn.table("single")
    with pytest.raises(pa.ArrowInvalid, match="must not be null"):
        table.lookup({"id": [None]})
    with pytest.raises(pa.ArrowInvalid, match="needs column"):
        table.lookup({"nope": [1]})
    with pytest.raises(pa.ArrowKeyError, match="does not exist"):
        conn.table("missing").lookup({"id": [1]})
    with pytest.raises(pa.ArrowInvalid, match="no column 'zzz'"):
        table.lookup({"id": [1]}, ["zzz"])
    with pytest.raises(pa.ArrowInvalid, match="leading primary key"):
        conn.table("composite").prefix_lookup({"id": [1]})
    assert table.lookup({"id": [2]}).num_rows == 1  # the stream goes on


def test_a_handle_follows_alter_table(tmp_path):
    running = RunningServer(tmp_path / "data")
    try:
        with flightstore.connect(running.uri, timeout=TIMEOUT) as conn:
            conn.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
            conn.table("t").upsert({"id": [1], "v": ["a"]})
            assert conn.table("t").lookup({"id": [1]}).schema.names == ["id", "v"]
            conn.sql("ALTER TABLE t ADD COLUMN w BIGINT")
            assert conn.table("t").lookup({"id": [1]}).to_pylist() == [{"id": 1, "v": "a", "w": None}]
            conn.sql("DROP TABLE t")
            conn.sql("CREATE TABLE t (id BIGINT, x DOUBLE, PRIMARY KEY (id) NOT ENFORCED)")
            conn.table("t").upsert({"id": [1], "x": [2.5]})
            assert conn.table("t").lookup({"id": [1]}).to_pylist() == [{"id": 1, "x": 2.5}]
    finally:
        running.stop()


def test_grants_hold_on_an_open_stream(tmp_path):
    store = Store(tmp_path / "data", fsync=False)
    users = {"admin": "a-pass", "bob": "b-pass"}
    server = FlightSqlServer(store, users=users, super_users=("admin",))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        with flightstore.connect(server.uri, username="admin", password="a-pass", timeout=TIMEOUT) as admin, \
                flightstore.connect(server.uri, username="bob", password="b-pass", timeout=TIMEOUT) as bob:
            admin.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
            admin.sql("CREATE TABLE u (id BIGINT, PRIMARY KEY (id) NOT ENFORCED)")
            admin.table("t").upsert({"id": [1], "v": ["a"]})
            with pytest.raises(pa.ArrowKeyError, match="does not exist"):  # hidden: answered as absent
                bob.table("t").lookup({"id": [1]})
            admin.sql("GRANT READ ON TABLE default.t TO bob")
            assert bob.table("t").lookup({"id": [1]}).to_pylist() == [{"id": 1, "v": "a"}]
            with pytest.raises(pa.ArrowKeyError, match="table default.u does not exist"):
                bob.table("u").lookup({"id": [1]})  # another table on the same stream: checked (hidden)
            admin.sql("REVOKE READ ON TABLE default.t FROM bob")
            with pytest.raises(flight.FlightUnauthorizedError, match="may not READ table default.t"):
                bob.table("t").lookup({"id": [1]})  # the open handle: refused at once
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_shutdown_ends_idle_streams(tmp_path):
    """A client holding an idle stream does not keep the server from stopping (GOAWAY)."""
    running = RunningServer(tmp_path / "data")
    conn = flightstore.connect(running.uri, timeout=TIMEOUT)
    try:
        conn.sql("CREATE TABLE t (id BIGINT, PRIMARY KEY (id) NOT ENFORCED)")
        conn.table("t").upsert({"id": [1]})
        assert conn.table("t").lookup({"id": [1]}).num_rows == 1
        stopper = threading.Thread(target=running.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=60)
        assert not stopper.is_alive(), "shutdown waited on an idle lookup stream"
    finally:
        conn.close()


def test_malformed_messages_end_the_stream_and_the_server_keeps_serving(loaded, conn):
    client = flight.FlightClient(loaded.uri)
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(wire.STREAM_COMMAND))
    writer.write_metadata(pa.py_buffer(b"\x07garbage"))
    with pytest.raises(pa.ArrowInvalid, match="malformed lookup-stream message"):
        reader.read_chunk()
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(wire.STREAM_COMMAND))
    writer.write_metadata(pa.py_buffer(wire.encode_request(wire.LOOKUP, 5, 1, b"not arrow")))
    kind, _, _, request_id, body = wire.decode_reply(reader.read_chunk().app_metadata)
    assert (kind, request_id) == (wire.ERROR, 1) and "not open" in wire.decode_error(body)[1]
    writer.write_metadata(pa.py_buffer(wire.encode_request(wire.OPEN, 5, 2, wire.HandleSpec("single").to_json())))
    assert wire.decode_reply(reader.read_chunk().app_metadata)[0] == wire.OPENED
    writer.write_metadata(pa.py_buffer(wire.encode_request(wire.LOOKUP, 5, 3, b"not arrow")))
    kind, _, _, _, body = wire.decode_reply(reader.read_chunk().app_metadata)
    assert kind == wire.ERROR and "malformed lookup keys" in wire.decode_error(body)[1]
    writer.done_writing()
    client.close()
    with pytest.raises(pa.ArrowNotImplementedError, match="lookup stream only"):
        w, r = flight.FlightClient(loaded.uri).do_exchange(flight.FlightDescriptor.for_command(b"other"))
        r.read_chunk()
    assert conn.table("single").lookup({"id": [3]}).num_rows == 1


# ---- a server killed under the stream -------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess(ForkedServerProcess):
    """``flightstore serve`` in its own process (so it can be killed -9), on a fixed port, started
    (forked from the preloaded fork server: tests/forked_server.py)."""

    def __init__(self, data_dir: Path, port: int) -> None:
        super().__init__(["--data-dir", str(data_dir), "--port", str(port), "--no-fsync"],
                         log=data_dir.with_name("server.log"))
        self.start()
        self.uri = f"grpc://127.0.0.1:{port}"  # a restart comes back at the same address


@pytest.fixture
def killable(tmp_path):
    started: list[ServerProcess] = []
    port = _free_port()

    def start() -> ServerProcess:
        server = ServerProcess(tmp_path / "data", port)
        started.append(server)
        return server
    yield start
    for server in started:
        server.kill()


def test_a_broken_stream_is_retried_or_fails_clearly(killable):
    server = killable()
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        conn.table("t").upsert({"id": list(range(100)), "v": [f"v{i}" for i in range(100)]})
        table = conn.table("t")
        assert table.lookup({"id": [7]}).to_pylist() == [{"id": 7, "v": "v7"}]
        stream = conn._lookups.current()
        server.kill()  # mid-stream: the open stream breaks
        wait_until(lambda: stream.broken is not None, "the client seeing its stream break", timeout=TIMEOUT)
        with pytest.raises(flight.FlightUnavailableError, match="was not answered"):
            table.lookup({"id": [8]})
        server = killable()  # back on the same port and data: a lookup opens a new stream

        def answered() -> bool:  # UNAVAILABLE until the connection is back, then the right rows
            try:
                found = table.lookup({"id": [8, 9]}).to_pylist()
            except flight.FlightUnavailableError:
                return False
            assert found == [{"id": 8, "v": "v8"}, {"id": 9, "v": "v9"}]
            return True
        wait_until(answered, "lookups answering again after the restart", timeout=TIMEOUT)
        # Killed while lookups are in flight from threads: each one answers right or fails clearly.
        outcomes: list = []

        def look(key: int) -> None:
            try:
                for _ in range(200):
                    found = table.lookup({"id": [key]}).to_pylist()
                    outcomes.append(found == [{"id": key, "v": f"v{key}"}])
            except flight.FlightUnavailableError as exc:
                outcomes.append(exc)
        threads = [threading.Thread(target=look, args=(k,)) for k in (10, 20, 30)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(outcomes) >= 6, "lookups flowing", timeout=TIMEOUT)
        server.kill()
        for thread in threads:
            thread.join(timeout=TIMEOUT)
        assert not any(thread.is_alive() for thread in threads), "a lookup hung on a dead server"
        assert all(o is True or isinstance(o, flight.FlightUnavailableError) for o in outcomes), outcomes
        assert sum(isinstance(o, flight.FlightUnavailableError) for o in outcomes) == 3  # each thread, once


def test_send_answers_each_request_once_with_its_rows_or_its_error(loaded, conn):
    """``LookupStream.send`` (the lookuper's requests: a callback, no Future): a one-part answer
    is one RecordBatch, an answer cut into parts is the Table of all of them, and a stream that
    cannot take the request answers StreamBroken; each callback runs exactly once."""
    stream = conn._lookups._open_stream()  # a stream of its own: closed at the end
    spec = wire.HandleSpec("single", key_index=True)
    opened = stream.opened(spec, TIMEOUT)
    answers: list = []
    done = threading.Event()

    def answered(rows, error) -> None:
        answers.append((rows, error))
        done.set()

    def ask(ids: list[int]) -> tuple:
        answers.clear()
        done.clear()
        stream.send(opened, spec, pa.record_batch([pa.array(ids, pa.int64())], schema=opened.key_schema), answered)
        assert done.wait(TIMEOUT), "no answer"
        assert len(answers) == 1, answers
        return answers[0]

    rows, error = ask([3, ROWS + 5, 1])
    assert error is None and type(rows) is pa.RecordBatch
    assert rows.column("id").to_pylist() == [3, 1]
    assert rows.column(wire.KEY_INDEX_COLUMN).to_pylist() == [0, 2]
    served = loaded.server
    before = served.max_batch_rows
    served.max_batch_rows = 2  # the answer of 5 keys comes in 3 parts
    try:
        rows, error = ask([5, 6, 7, 8, 9])
    finally:
        served.max_batch_rows = before
    assert error is None and type(rows) is pa.Table
    assert rows.column("id").to_pylist() == [5, 6, 7, 8, 9]
    assert len(rows.column("id").chunks) == 3
    stream.close()
    rows, error = ask([1])  # answered in this thread: the stream takes nothing more
    assert rows is None and isinstance(error, StreamBroken), error


def test_key_index_positions_of_all_found_duplicated_and_prefix_keys(loaded, conn):
    """Each row's key index is its key's first occurrence in the request: keys all found and
    distinct (rows in key order, answered without a match), a key asked twice (both rows point at
    its first occurrence), and a prefix lookup whose rows happen to be as many as its prefixes
    (they all belong to one prefix)."""
    stream = conn._lookups._open_stream()
    answers: list = []
    done = threading.Event()

    def answered(rows, error) -> None:
        answers.append((rows, error))
        done.set()

    def ask(spec: wire.HandleSpec, columns: dict) -> pa.RecordBatch:
        opened = stream.opened(spec, TIMEOUT)
        answers.clear()
        done.clear()
        stream.send(opened, spec, pa.record_batch(
            [pa.array(v, opened.key_schema.field(c).type) for c, v in columns.items()], schema=opened.key_schema),
            answered)
        assert done.wait(TIMEOUT), "no answer"
        rows, error = answers[0]
        assert error is None, error
        return rows

    try:
        single = wire.HandleSpec("single", key_index=True)
        rows = ask(single, {"id": [7, 2, 30, 11]})
        assert rows.column("id").to_pylist() == [7, 2, 30, 11]
        assert rows.column(wire.KEY_INDEX_COLUMN).to_pylist() == [0, 1, 2, 3]
        rows = ask(single, {"id": [3, 3, 1]})
        assert rows.column("id").to_pylist() == [3, 3, 1]
        assert rows.column(wire.KEY_INDEX_COLUMN).to_pylist() == [0, 0, 2]
        prefix = wire.HandleSpec("composite", kind="prefix", key_columns=("g",), key_index=True)
        per_group = ROWS // GROUPS
        rows = ask(prefix, {"g": [1] + [GROUPS + i for i in range(per_group - 1)]})
        assert rows.num_rows == per_group and set(rows.column("g").to_pylist()) == {1}
        assert rows.column(wire.KEY_INDEX_COLUMN).to_pylist() == [0] * per_group
    finally:
        stream.close()
