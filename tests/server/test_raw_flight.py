"""Raw pyarrow.flight: one endpoint by default; with the session option
``flightstore.per-bucket-endpoints`` one endpoint per bucket, each ticket readable alone, in any
order, anywhere."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.server import protocol, service, tickets

BUCKETS = 5
N = 20_000


@pytest.fixture
def loaded(server):
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE m (id BIGINT, grp STRING, v DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
                 f"WITH ('bucket.num' = '{BUCKETS}')")
        conn.sql("CREATE TABLE lg (id BIGINT, v DOUBLE) WITH ('bucket.num' = '3')")
        rng = np.random.default_rng(5)
        data = pa.table({"id": pa.array(np.arange(N, dtype=np.int64)),
                         "grp": pa.array([f"g{i % 13}" for i in range(N)]),
                         "v": pa.array(rng.random(N))})
        conn.table("m").upsert(data)
        for piece in data.select(["id", "v"]).to_batches(max_chunksize=N // 6):  # keyless: a bucket per batch
            conn.table("lg").append(pa.Table.from_batches([piece]))
    return server, data


def _info(client: flight.FlightClient, sql: str) -> flight.FlightInfo:
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command))


def _per_bucket(client: flight.FlightClient, on: bool = True) -> None:
    """Ask this connection's session for one endpoint per bucket (as the Spark connector does)."""
    request = protocol.SetSessionOptionsRequest()
    request.session_options["flightstore.per-bucket-endpoints"].bool_value = on
    [answer] = client.do_action(flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString()))
    assert not protocol.parse("SetSessionOptionsResult", answer.body.to_pybytes()).errors


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names]).combine_chunks()


@pytest.mark.parametrize("sql,table,columns", [
    ("SELECT * FROM m", "m", ["id", "grp", "v"]),
    ("SELECT v, id FROM m WHERE v > 0.5", "m", ["v", "id"]),
    ("SELECT * FROM lg", "lg", ["id", "v"]),
])
def test_scan_has_one_endpoint_per_bucket_readable_alone(loaded, sql, table, columns) -> None:
    server, data = loaded
    client = flight.FlightClient(server.uri)
    _per_bucket(client)
    info = _info(client, sql)
    buckets = server.store.table(table).num_buckets
    assert len(info.endpoints) == buckets
    assert len({e.ticket.ticket for e in info.endpoints}) == buckets
    assert info.schema.names == columns
    whole = pa.concat_tables([client.do_get(e.ticket).read_all() for e in info.endpoints])
    client.close()

    # each ticket alone, in reverse order, each from a fresh client
    pieces = []
    for endpoint in reversed(info.endpoints):
        fresh = flight.FlightClient(server.uri)
        piece = fresh.do_get(endpoint.ticket).read_all()
        fresh.close()
        assert piece.schema.equals(info.schema), (piece.schema, info.schema)
        pieces.append(piece)
    assert sum(p.num_rows > 0 for p in pieces) == buckets  # 20k rows land in every bucket
    joined = pa.concat_tables(pieces)

    expected = data.select(columns)
    if "WHERE" in sql:
        expected = expected.filter(pa.compute.greater(expected["v"], 0.5))
    expected = expected.cast(info.schema)
    assert _sorted(joined).equals(_sorted(expected))
    assert _sorted(whole).equals(_sorted(expected))


@pytest.mark.parametrize("sql", ["SELECT * FROM m", "SELECT id FROM lg WHERE v > 0.5",
                                 "SELECT id, _change_type FROM m$changelog"])
def test_scan_has_one_endpoint_streaming_every_bucket_by_default(loaded, sql) -> None:
    """Clients that read only ``endpoints[0]`` get every row; switching the option off again (or
    another connection) brings the single endpoint back."""
    server, data = loaded
    client = flight.FlightClient(server.uri)
    other = flight.FlightClient(server.uri)
    try:
        _per_bucket(other)
        assert len(_info(other, sql).endpoints) > 1
        for _ in range(2):
            info = _info(client, sql)
            assert len(info.endpoints) == 1
            table = client.do_get(info.endpoints[0].ticket).read_all()
            expected = data.filter(pa.compute.greater(data["v"], 0.5)) if "WHERE" in sql else data
            assert sorted(table.column("id").to_pylist()) == sorted(expected.column("id").to_pylist())
            _per_bucket(other, False)
            client, other = other, client
    finally:
        client.close()
        other.close()


def test_pieces_are_disjoint_buckets(loaded) -> None:
    server, _ = loaded
    client = flight.FlightClient(server.uri)
    _per_bucket(client)
    info = _info(client, "SELECT id FROM m")
    seen: set[int] = set()
    for endpoint in info.endpoints:
        ids = set(client.do_get(endpoint.ticket).read_all().column("id").to_pylist())
        assert not ids & seen
        seen |= ids
    assert seen == set(range(N))
    client.close()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM m WHERE id = 7",
    "SELECT * FROM m LIMIT 10",
    "SELECT COUNT(*) FROM m",
    "SELECT grp, COUNT(*) AS n, SUM(v) AS s FROM m GROUP BY grp ORDER BY grp",
    "SELECT * FROM m$changelog WHERE id < 100",
])
def test_flight_info_schema_equals_the_stream_schema(loaded, sql) -> None:
    server, _ = loaded
    client = flight.FlightClient(server.uri)
    info = _info(client, sql)
    assert len(info.schema) > 0
    rows = 0
    for endpoint in info.endpoints:
        reader = client.do_get(endpoint.ticket)
        assert reader.schema.equals(info.schema), (reader.schema, info.schema)
        table = reader.read_all()
        assert table.schema.equals(info.schema)
        rows += table.num_rows
    assert rows > 0
    client.close()


# ---- small results travel in their ticket ---------------------------------------------------

def test_point_lookup_result_travels_in_its_ticket(loaded) -> None:
    server, data = loaded
    client = flight.FlightClient(server.uri)
    info = _info(client, "SELECT grp, v FROM m WHERE id = 7")
    [endpoint] = info.endpoints
    assert info.total_records == 1
    assert tickets.is_result(endpoint.ticket.ticket)
    expected = data.slice(7, 1).select(["grp", "v"])
    # The answer was computed at GetFlightInfo: a write before DoGet does not change it, any
    # client can read the ticket, as often as it likes.
    with flightstore.connect(server.uri) as conn:
        conn.table("m").upsert(pa.table({"id": [7], "grp": ["changed"], "v": [0.0]}))
    for reader in (client, flight.FlightClient(server.uri)):
        got = reader.do_get(endpoint.ticket).read_all()
        assert got.equals(expected)
        assert got.schema.equals(info.schema)
    # a second identical query gets its own ticket (CancelFlightInfo cancels only its own)
    again = _info(client, "SELECT grp, v FROM m WHERE id = 7")
    assert again.endpoints[0].ticket.ticket != endpoint.ticket.ticket
    assert client.do_get(again.endpoints[0].ticket).read_all().column("grp").to_pylist() == ["changed"]
    request = protocol.CancelFlightInfoRequest(info=info.serialize())
    list(client.do_action(flight.Action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())))
    with pytest.raises(flight.FlightCancelledError):
        client.do_get(endpoint.ticket).read_all()
    assert client.do_get(again.endpoints[0].ticket).read_all().num_rows == 1
    client.close()


def test_large_point_lookup_result_is_kept_on_the_server(loaded) -> None:
    server, _ = loaded
    client = flight.FlightClient(server.uri)
    ids = list(range(0, N, 2))  # 10,000 keys: far more than an inline ticket may carry
    info = _info(client, f"SELECT id, grp, v FROM m WHERE id IN ({', '.join(map(str, ids))})")
    [endpoint] = info.endpoints
    assert not tickets.is_result(endpoint.ticket.ticket)
    assert len(endpoint.ticket.ticket) < tickets.INLINE_RESULT_BYTES
    got = client.do_get(endpoint.ticket).read_all()
    assert sorted(got.column("id").to_pylist()) == ids
    assert info.total_records == len(ids)
    client.close()


def test_malformed_result_ticket_is_an_error_not_a_crash(loaded) -> None:
    server, _ = loaded
    client = flight.FlightClient(server.uri)
    with pytest.raises(pa.ArrowInvalid, match=tickets.UNKNOWN_TICKET):  # no tag of this server
        client.do_get(flight.Ticket(tickets.RESULT_PREFIX + b"12345678" + b"not arrow")).read_all()
    assert client.do_get(_info(client, "SELECT COUNT(*) FROM m").endpoints[0].ticket).read_all() \
        .column(0).to_pylist() == [N]
    client.close()


def test_scan_messages_stay_within_the_batch_byte_limit(loaded) -> None:
    server, _ = loaded
    client = flight.FlightClient(server.uri)
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE wide (a DOUBLE, b DOUBLE, c DOUBLE, d DOUBLE)")
        n = 200_000  # 6.4 MB
        conn.table("wide").append(pa.table({name: pa.array(np.arange(n, dtype=np.float64))
                                            for name in "abcd"}))
    info = _info(client, "SELECT * FROM wide")
    sizes = [chunk.data.nbytes for e in info.endpoints for chunk in client.do_get(e.ticket)]
    assert sum(sizes) == n * 4 * 8
    assert len(sizes) > 1 and max(sizes) <= service.MAX_BATCH_BYTES
    client.close()
