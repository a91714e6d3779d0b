"""A query stops when its client cancels (CancelFlightInfo), disconnects, or passes the server's
``query.timeout``; a result past ``query.max-result-rows`` ends with RESOURCE_EXHAUSTED. In each
case the query's work stops on the server (DuckDB interrupted, no query running) and the server
keeps serving. The self cross join below would run for hours (400M rows) if nothing stopped it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.server import protocol
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

ROWS = 20_000
CROSS_JOIN = "SELECT a.id, b.id, a.v FROM t a, t b"
# A stream of slowish batches (400M pairs hashed for 800k rows): it runs for long.
SLOW_STREAM = "SELECT a.id, b.id FROM t a, t b WHERE hash(a.id * 31 + b.id) % 500 = 0"
# One batch that takes DuckDB long (2.5 G hashes) before any row comes out.
SLOW_AGGREGATE = "SELECT max(hash(a.id + b.id + c.id)) FROM t a, t b, t c WHERE c.id < 6"
CAP = 300_000


def _server(data_dir, options: dict[str, str]) -> RunningServer:
    running = RunningServer(data_dir, options=options)
    table = running.store.create_table("t", pa.schema([("id", pa.int64()), ("v", pa.float64())]),
                                       options={"bucket.num": "2"})
    ids = np.arange(ROWS, dtype=np.int64)
    table.append(pa.table({"id": ids, "v": ids.astype(np.float64)}))
    return running


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """No row cap, a long timeout: only the client stops these queries."""
    running = _server(tmp_path_factory.mktemp("limits") / "data", {"query.max-result-rows": "0"})
    yield running
    running.stop()


@pytest.fixture
def limited(tmp_path):
    running = _server(tmp_path / "data", {"query.max-result-rows": str(CAP), "query.timeout": "2s"})
    yield running
    running.stop()


def _info(client: flight.FlightClient, sql: str) -> flight.FlightInfo:
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command))


def _idle(served) -> bool:
    """No query stream registered, none inside DuckDB, and the active-queries metric at 0."""
    active = served.server.metrics.active_queries._value.get()
    return served.server.queries.count() == 0 and served.server.executor.engine.running() == 0 \
        and active == 0


def _still_serving(served) -> None:
    client = flight.FlightClient(served.uri)
    info = _info(client, "SELECT count(*) AS n, sum(id) AS s FROM t WHERE id < 10")
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"n": 10, "s": 45}]
    client.close()


def _drain_until_error(reader) -> BaseException:
    def failed():
        try:
            reader.read_chunk()
        except StopIteration:
            raise AssertionError("the stream ended normally instead of failing") from None
        except flight.FlightError as exc:
            return exc
        return None
    return wait_until(failed, "the stream failing", timeout=60, poll=0)


def test_cancel_flight_info_stops_a_running_stream(served) -> None:
    client = flight.FlightClient(served.uri)
    info = _info(client, SLOW_STREAM)
    reader = client.do_get(info.endpoints[0].ticket)
    assert reader.read_chunk().data.num_rows > 0
    wait_until(lambda: served.server.executor.engine.running() == 1, "the query running in DuckDB")
    stopped = served.server.executor.engine.stopped["cancelled"]
    request = protocol.CancelFlightInfoRequest(info=info.serialize())
    list(client.do_action(flight.Action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())))
    error = _drain_until_error(reader)
    assert isinstance(error, flight.FlightCancelledError), error
    wait_until(lambda: _idle(served), "the cancelled query's work stopping", timeout=30)
    assert served.server.executor.engine.stopped["cancelled"] == stopped + 1
    _still_serving(served)
    client.close()


def test_a_client_that_disconnects_stops_its_query(served) -> None:
    client = flight.FlightClient(served.uri)
    reader = client.do_get(_info(client, SLOW_STREAM).endpoints[0].ticket)
    assert reader.read_chunk().data.num_rows > 0
    wait_until(lambda: served.server.executor.engine.running() == 1, "the query running in DuckDB")
    reader.cancel()
    client.close()
    wait_until(lambda: _idle(served), "the abandoned query's work stopping", timeout=30)
    _still_serving(served)


def test_a_query_past_its_timeout_is_interrupted_mid_batch(limited) -> None:
    served = limited
    client = flight.FlightClient(served.uri)
    stopped = served.server.executor.engine.stopped["timeout"]
    with pytest.raises(flight.FlightTimedOutError, match="query.timeout"):
        client.do_get(_info(client, SLOW_AGGREGATE).endpoints[0].ticket).read_all()
    wait_until(lambda: _idle(served), "the timed-out query's work stopping", timeout=30)
    assert served.server.executor.engine.stopped["timeout"] == stopped + 1  # DuckDB was interrupted
    with flightstore.connect(served.uri, timeout=60) as conn, \
            pytest.raises(flight.FlightTimedOutError, match="query.timeout"):
        conn.sql(SLOW_AGGREGATE)  # the Python client's one-DoGet sql()
    wait_until(lambda: _idle(served), "the timed-out sql() query's work stopping", timeout=30)
    assert served.server.executor.engine.stopped["timeout"] == stopped + 2
    _still_serving(served)
    client.close()


def test_a_result_past_the_row_cap_is_refused_with_resource_exhausted(limited) -> None:
    served = limited
    client = flight.FlightClient(served.uri)
    reader = client.do_get(_info(client, CROSS_JOIN).endpoints[0].ticket)
    error = _drain_until_error(reader)
    assert "RESOURCE_EXHAUSTED" in str(error) and "query.max-result-rows" in str(error), error
    wait_until(lambda: _idle(served), "the refused query's work stopping", timeout=30)
    _still_serving(served)
    client.close()
