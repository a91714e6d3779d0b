"""A real server with users, grants, an embedded lake and the console, loaded with one table of
each kind, for the console's tests (HTTP API and browser)."""

from __future__ import annotations

import base64
import http.cookiejar
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

import flightstore
from flightstore.lake import LakeSettings
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.waiting import wait_until

PASSWORDS = {"admin": "adm1n-pw", "alice": "al1ce-pw", "bob": "b0b-pw"}
ALICE_TABLES = {"default.events", "default.accounts", "default.lakey"}  # granted READ
ALL_TABLES = ALICE_TABLES | {"default.daily"}


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any = field(default=None)


class Http:
    """The console's HTTP API through urllib: Basic credentials, or a session cookie kept in a jar."""

    def __init__(self, base: str, credentials: tuple[str, str] | None = None) -> None:
        self.base = base
        self.credentials = credentials
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar),
                                                  _NoRedirect())

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> Answer:
        request = urllib.request.Request(self.base + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if self.credentials is not None:
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with self.opener.open(request, timeout=60) as answer:
                status, raw, got = answer.status, answer.read(), answer.headers
        except urllib.error.HTTPError as exc:
            status, raw, got = exc.code, exc.read(), exc.headers
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode()
        return Answer(status, parsed, got)

    def get(self, path: str) -> Answer:
        return self.call("GET", path)

    def ok(self, path: str) -> Any:
        answer = self.get(path)
        assert answer.status == 200, (path, answer.status, answer.body)
        return answer.body


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None  # a 303 stays a 303: the tests look at it


class ConsoleServer:
    def __init__(self, data_dir) -> None:
        self.store = Store(data_dir, fsync=False)
        self.lake = LakeSettings.from_options(data_dir, {"datalake.tiering.retry-backoff.max": "200ms"})
        self.server = FlightSqlServer(self.store, "grpc://127.0.0.1:0", users=dict(PASSWORDS),
                                      super_users=("admin",), lake=self.lake)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri
        self.port = self.server.serve_console("127.0.0.1", 0, sample_interval_s=0.2)
        self.base = f"http://127.0.0.1:{self.port}"

    def connect(self, user: str = "admin") -> flightstore.Connection:
        return flightstore.connect(self.uri, username=user, password=PASSWORDS[user], timeout=120)

    def http(self, user: str | None = "admin") -> Http:
        return Http(self.base, None if user is None else (user, PASSWORDS[user]))

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()


def load(running: ConsoleServer) -> None:
    """One table of each kind, a few rows each; alice may read three of them, bob none."""
    with running.connect() as conn:
        conn.sql("CREATE TABLE events (id BIGINT, kind STRING) WITH ('bucket.num' = '3', 'bucket.key' = 'id')")
        conn.sql("CREATE TABLE accounts (id BIGINT, name STRING, balance DOUBLE, PRIMARY KEY (id)) "
                 "WITH ('bucket.num' = '2')")
        conn.sql("CREATE TABLE daily (id BIGINT, day STRING) PARTITIONED BY (day) WITH ('bucket.num' = '2')")
        conn.sql("CREATE TABLE lakey (id BIGINT, v STRING) WITH ('bucket.num' = '2', 'bucket.key' = 'id', "
                 "'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '200ms')")
        ids = pa.array(range(40), pa.int64())
        conn.table("events").append(pa.table({"id": ids, "kind": pa.array([f"k{i % 4}" for i in range(40)])}))
        conn.table("accounts").upsert(pa.table({"id": ids.slice(0, 25), "name": [f"n{i}" for i in range(25)],
                                                "balance": [i * 1.5 for i in range(25)]}))
        conn.table("accounts").upsert(pa.table({"id": ids.slice(0, 5), "name": ["again"] * 5,
                                                "balance": [0.0] * 5}))  # updates: changelog > rows
        conn.sql("INSERT INTO daily VALUES (1, '2026-01-01'), (2, '2026-01-01'), (3, '2026-01-02')")
        conn.table("lakey").append(pa.table({"id": ids.slice(0, 30), "v": [f"v{i}" for i in range(30)]}))
        conn.sql("ALTER TABLE events ADD COLUMN note STRING")  # schema version 2
        conn.table("accounts").snapshot()
        for name in ("events", "accounts", "lakey"):
            conn.sql(f"GRANT READ ON TABLE default.{name} TO alice")
    tierer = running.server.tierer
    wait_until(lambda: tierer.status("default.lakey").lag_records == 0, "lakey tiered", timeout=90)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    running = ConsoleServer(tmp_path_factory.mktemp("console") / "data")
    try:
        load(running)
        yield running
    finally:
        running.stop()
