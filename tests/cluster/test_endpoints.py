"""Cluster mode keeps the endpoint rule of a single server: a query answers one Flight endpoint
that streams every bucket the server holds (clients reading only the first endpoint get whole
answers), and one endpoint per bucket only when the session asks for it."""

from __future__ import annotations

import pytest
from pyarrow import flight

import flightstore
from flightstore.server import protocol

pytestmark = pytest.mark.timeout(600)
CALL = flight.FlightCallOptions(timeout=60)


def _info(client: flight.FlightClient, sql: str) -> flight.FlightInfo:
    command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command), CALL)


def test_one_endpoint_by_default_per_bucket_on_request(servers, observer):
    uri = servers.start(1).uri
    observer.wait(lambda v: set(v.servers) == {1} and v.coordinator == 1, "server 1 coordinating")
    with flightstore.connect(uri) as conn:
        conn.sql("CREATE DATABASE shop")
        conn.sql("CREATE TABLE shop.clicks (id BIGINT, page STRING) WITH ('bucket.num' = '3')")
        for i in range(3):  # a log table without bucket key: one batch per bucket, round robin
            conn.sql(f"INSERT INTO shop.clicks VALUES ({i}, 'p{i}')")
    client = flight.FlightClient(uri)
    try:
        info = _info(client, "SELECT * FROM shop.clicks")
        assert len(info.endpoints) == 1
        first = client.do_get(info.endpoints[0].ticket, CALL).read_all()
        assert sorted(first.column("id").to_pylist()) == [0, 1, 2]
        request = protocol.SetSessionOptionsRequest()
        request.session_options["flightstore.per-bucket-endpoints"].bool_value = True
        list(client.do_action(flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString()), CALL))
        info = _info(client, "SELECT * FROM shop.clicks")
        assert len(info.endpoints) == 3
        pieces = [client.do_get(e.ticket, CALL).read_all().column("id").to_pylist() for e in info.endpoints]
        assert sorted(len(p) for p in pieces) == [1, 1, 1]
        assert sorted(sum(pieces, [])) == [0, 1, 2]
    finally:
        client.close()
