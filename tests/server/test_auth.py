"""Basic authentication: credentials in, bearer token back; wrong or missing credentials refused."""

from __future__ import annotations

import threading

import adbc_driver_flightsql.dbapi as dbapi
import pyarrow.flight as flight
import pytest

import flightstore
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store


@pytest.fixture
def secured(tmp_path):
    store = Store(tmp_path / "data")
    server = FlightSqlServer(store, users={"alice": "s3cret"})
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def test_basic_auth_python_client_and_adbc(secured):
    with flightstore.connect(secured.uri, username="alice", password="s3cret") as conn:
        conn.sql("CREATE TABLE t (a BIGINT)")
        conn.sql("INSERT INTO t VALUES (1)")
    with dbapi.connect(secured.uri, db_kwargs={"username": "alice", "password": "s3cret"},
                       autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM t")
        assert cur.fetchall() == [(1,)]


def test_wrong_or_missing_credentials_are_refused(secured):
    with pytest.raises(flight.FlightUnauthenticatedError):
        flightstore.connect(secured.uri, username="alice", password="wrong")
    anonymous = flightstore.connect(secured.uri)
    with pytest.raises(flight.FlightUnauthenticatedError):
        anonymous.sql("SELECT 1")
    anonymous.close()
