"""Over Flight SQL, a damaged log is a DATA_LOSS error naming table and bucket (never fewer rows),
while what is intact (a primary-key table's KV, other tables) keeps answering."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.catalog import read_table_dir
from flightstore.store import Store
from tests.kv.test_log_damage import build, flip, log_file, records
from tests.server.conftest import RunningServer


def _query(client: flight.FlightClient, sql: str) -> pa.Table:
    from flightstore.server import protocol
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    options = flight.FlightCallOptions(timeout=30)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command), options)
    return pa.concat_tables([client.do_get(e.ticket, options).read_all() for e in info.endpoints])


def test_damaged_log_answers_data_loss_and_the_rest_keeps_serving(tmp_path):
    data_dir = tmp_path / "data"
    state, _ = build(data_dir)
    with Store(data_dir, fsync=False) as store:
        logs = store.create_table("lg", pa.schema([("a", pa.int64())]))
        for start in range(0, 50, 10):
            logs.append({"a": list(range(start, start + 10))})
    path = log_file(data_dir)
    bad = records(path)[5]
    flip(path, bad.payload_position + bad.payload_len // 2)
    [log_path] = (read_table_dir(data_dir, "lg") / "bucket-0" / "log").glob("*.log")
    bad_log = records(log_path)[2]  # holds a = 20..29: flip a byte of the value 25
    flip(log_path, log_path.read_bytes().index((25).to_bytes(8, "little"), bad_log.payload_position))

    running = RunningServer(data_dir)
    try:
        client = flight.FlightClient(running.uri)
        assert _query(client, "SELECT v FROM t WHERE id = 3").to_pylist() == [{"v": state[3]}]
        assert _query(client, "SELECT COUNT(*) AS n FROM t").to_pylist() == [{"n": len(state)}]
        assert _query(client, "SELECT COUNT(*) AS n FROM (SELECT * FROM t)").to_pylist() == [
            {"n": len(state)}]
        for sql, table, lost in (("SELECT * FROM t$changelog", "t", bad),
                                 ("SELECT a FROM lg", "lg", bad_log),
                                 ("SELECT SUM(a) FROM lg", "lg", bad_log)):
            with pytest.raises(flight.FlightInternalError) as caught:
                _query(client, sql)
            message = str(caught.value)
            assert message.startswith("DATA_LOSS: "), message
            assert f"table default.{table} bucket 0: log offsets {lost.base_offset}.." \
                   f"{lost.next_offset - 1}" in message
            assert "Traceback" not in message and str(tmp_path) not in message
        with flightstore.connect(running.uri) as conn:  # writes and reads go on
            conn.sql("INSERT INTO t VALUES (5000, 'x')")
            assert conn.sql("SELECT v FROM t WHERE id = 5000").to_pylist() == [{"v": "x"}]
        client.close()
    finally:
        running.stop()
