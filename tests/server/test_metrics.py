"""Prometheus metrics: direct scrapes of a real server's endpoint checked value by value, and a real
Prometheus (Debian's ``prometheus`` package, installed when missing) scraping a real server, queried
through its HTTP API."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyarrow import flight

import flightstore
from flightstore.errors import InvalidOption
from flightstore.server.service import FlightSqlServer
from flightstore.server.tls import TlsConfig
from flightstore.store import Store
from tests.certs import make_certificates
from tests.system_packages import ensure
from tests.waiting import wait_until


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape: {(name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metered(tmp_path):
    store = Store(tmp_path / "data")
    server = FlightSqlServer(store, users={"admin": "adm1n"}, super_users=("admin",))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.metrics.serve('127.0.0.1', 0)}/metrics"
    yield server, url
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def test_scrape_reports_rpcs_rows_offsets_streams_and_memory(metered):
    server, url = metered
    with flightstore.connect(server.uri, username="admin", password="adm1n", timeout=60) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        conn.sql("CREATE TABLE lg (id BIGINT, w BIGINT)")
        kv = conn.table("kv")
        kv.upsert({"id": list(range(100)), "v": [f"v{i}" for i in range(100)]})
        conn.sql("INSERT INTO lg VALUES (1, 1), (2, 2), (3, 3)")
        assert kv.scan().num_rows == 100
        assert conn.sql("SELECT * FROM kv WHERE id = 7").num_rows == 1
        with pytest.raises(pa.ArrowInvalid):
            conn.sql("SELECT * FROM kv WHERE")
        offsets = kv.offsets()
        before = scrape(url)

        # RPC counts by method and status; latency histogram counts agree.
        # (the Python client sends each SQL statement as one DoGet of a flightstore "sql" ticket)
        assert value(before, "flightstore_rpc_total", method="DoGet", status="INVALID_ARGUMENT") == 1
        ok_gets = value(before, "flightstore_rpc_total", method="DoGet", status="OK")
        assert ok_gets >= 5
        assert value(before, "flightstore_rpc_duration_seconds_count", method="DoGet", status="OK") == ok_gets
        assert value(before, "flightstore_rpc_total", method="DoPut", status="OK") == 1
        # Rows and bytes in and out, per table.
        assert value(before, "flightstore_rows_in_total", table="default.kv") == 100
        assert value(before, "flightstore_rows_in_total", table="default.lg") == 3
        assert value(before, "flightstore_bytes_in_total", table="default.kv") > 0
        assert value(before, "flightstore_rows_out_total", table="default.kv") == 101
        assert value(before, "flightstore_bytes_out_total", table="default.kv") > 0
        # Offsets per bucket, as the table reports them.
        for bucket, end in offsets.items():
            assert value(before, "flightstore_log_end_offset", table="default.kv", bucket=str(bucket)) == end
            assert value(before, "flightstore_kv_applied_offset", table="default.kv", bucket=str(bucket)) == end
        assert value(before, "flightstore_log_end_offset", table="default.lg", bucket="0") == 3
        # Memory.
        assert value(before, "process_resident_memory_bytes") > 10_000_000
        assert ("flightstore_arrow_allocated_bytes", ()) in before

        # An open subscription is counted as one, not as a query, until it closes.
        assert value(before, "flightstore_active_subscriptions") == 0
        subscription = kv.subscribe("earliest")
        next(iter(subscription))
        wait_until(lambda: value(scrape(url), "flightstore_active_subscriptions") == 1, "subscription counted")
        assert value(scrape(url), "flightstore_active_queries") == 0
        subscription.close()
        wait_until(lambda: value(scrape(url), "flightstore_active_subscriptions") == 0, "subscription ended")

        # A query whose stream the client has not finished reading is active.
        n = 2_000_000
        conn.table("lg").append(pa.table({"id": np.arange(n), "w": np.arange(n)}))
        command = flight.FlightDescriptor.for_command(
            flightstore.client.protocol.pack_any(
                flightstore.client.protocol.CommandStatementQuery(query="SELECT * FROM lg")))
        info = conn._client.get_flight_info(command, conn._options)
        reader = conn._client.do_get(info.endpoints[0].ticket, conn._options)
        reader.read_chunk()
        wait_until(lambda: value(scrape(url), "flightstore_active_queries") == 1, "the open query counted")
        rest = reader.read_all()
        assert rest.num_rows > 0
        wait_until(lambda: value(scrape(url), "flightstore_active_queries") == 0, "the query finished")
        # GetFlightInfo: the subscription's (its start is fixed there) and this query's
        assert value(scrape(url), "flightstore_rpc_total", method="GetFlightInfo", status="OK") == 2

    # A call refused by authentication is counted under its status.
    client = flight.FlightClient(server.uri)
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.list_actions(flight.FlightCallOptions(timeout=30)))
    assert value(scrape(url), "flightstore_rpc_total", method="ListActions", status="UNAUTHENTICATED") == 1


# ---- a real Prometheus ---------------------------------------------------------------------------
def _prometheus() -> str:
    ensure("prometheus")
    return shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
    except OSError:
        return []  # not up yet
    return answer["data"]["result"] if answer.get("status") == "success" else []


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run may install Prometheus with apt-get
def test_prometheus_scrapes_a_real_server(tmp_path):
    binary = _prometheus()
    server = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                               "--port", "0", "--metrics-port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    prometheus = None
    try:
        uri = server.stdout.readline().split(" at ", 1)[1].strip()
        metrics_line = server.stdout.readline()
        assert metrics_line.startswith("flightstore metrics at http://127.0.0.1:"), metrics_line
        target = metrics_line.split("http://", 1)[1].split("/", 1)[0]
        with flightstore.connect(uri, timeout=60) as conn:
            conn.sql("CREATE TABLE t (id BIGINT, v STRING)")
            conn.table("t").append({"id": list(range(42)), "v": ["x"] * 42})
            for _ in range(5):
                conn.sql("SELECT COUNT(*) FROM t")
        config = tmp_path / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          "scrape_configs:\n  - job_name: flightstore\n"
                          f"    static_configs:\n      - targets: ['{target}']\n")
        port = _free_port()
        prometheus = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def sample(promql: str) -> float | None:
            result = _query(port, promql)
            return float(result[0]["value"][1]) if result else None

        gets = 'flightstore_rpc_total{job="flightstore",method="DoGet",status="OK"}'
        assert wait_until(lambda: (sample(gets) or 0) >= 6, "Prometheus scraping our RPC counts", timeout=240)
        assert wait_until(lambda: sample('flightstore_log_end_offset{table="default.t",bucket="0"}') == 42,
                          "Prometheus scraping the log end offset", timeout=120)
        assert wait_until(lambda: sample('flightstore_rows_in_total{table="default.t"}') == 42,
                          "Prometheus scraping rows in", timeout=120)
        assert wait_until(lambda: (sample('process_resident_memory_bytes{job="flightstore"}') or 0) > 0,
                          "Prometheus scraping memory", timeout=120)
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=60)
        server.terminate()
        server.wait(timeout=60)


# ---- who may scrape, over what, and what the series name ------------------------------------------
def _get(url: str, credentials: tuple[str, str] | None = None, context=None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if credentials is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(credentials).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@contextlib.contextmanager
def _server(tmp_path, options: dict | None = None, **kwargs):
    store = Store(tmp_path / "data", options=options)
    server = FlightSqlServer(store, **kwargs)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_a_server_with_users_serves_metrics_only_to_users_who_may_describe_the_cluster(tmp_path):
    with _server(tmp_path, users={"admin": "adm1n", "alice": "al1ce"}, super_users=("admin",)) as server:
        url = f"http://127.0.0.1:{server.serve_metrics('127.0.0.1', 0)}/metrics"
        status, _ = _get(url)
        assert status == 401
        assert _get(url, ("alice", "wrong"))[0] == 401
        status, text = _get(url, ("alice", "al1ce"))
        assert status == 403 and "user 'alice' may not DESCRIBE cluster" in text
        status, text = _get(url, ("admin", "adm1n"))
        assert status == 200 and "flightstore_rpc_total" in text
        with flightstore.connect(server.uri, username="admin", password="adm1n", timeout=60) as admin:
            admin.sql("GRANT DESCRIBE ON CLUSTER TO alice")
        assert _get(url, ("alice", "al1ce"))[0] == 200


def test_metrics_auth_none_opens_the_endpoint_and_basic_needs_users(tmp_path):
    with _server(tmp_path / "a", {"metrics.auth": "none"}, users={"admin": "adm1n"}) as server:
        assert _get(f"http://127.0.0.1:{server.serve_metrics('127.0.0.1', 0)}/metrics")[0] == 200
    with _server(tmp_path / "b", {"metrics.auth": "basic"}) as server:
        with pytest.raises(InvalidOption, match="metrics.auth"):
            server.serve_metrics("127.0.0.1", 0)
    with _server(tmp_path / "c") as server:  # no users: the endpoint is open, as the server is
        assert _get(f"http://127.0.0.1:{server.serve_metrics('127.0.0.1', 0)}/metrics")[0] == 200


def test_metrics_over_https(tmp_path):
    certs = make_certificates(tmp_path / "certs")
    tls = TlsConfig.from_files(certs.server_cert, certs.server_key)
    with _server(tmp_path / "a", {"metrics.tls": True}, tls=tls, users={"admin": "adm1n"},
                 super_users=("admin",)) as server:
        port = server.serve_metrics("127.0.0.1", 0)
        context = ssl.create_default_context(cafile=str(certs.ca))
        status, text = _get(f"https://127.0.0.1:{port}/metrics", ("admin", "adm1n"), context)
        assert status == 200 and "flightstore_rpc_total" in text
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            _get(f"http://127.0.0.1:{port}/metrics", ("admin", "adm1n"))  # plain HTTP is not spoken
    with _server(tmp_path / "b", {"metrics.tls": True}) as server:
        with pytest.raises(InvalidOption, match="metrics.tls"):
            server.serve_metrics("127.0.0.1", 0)


def test_table_labels_can_be_left_out(tmp_path):
    with _server(tmp_path, {"metrics.table-labels": False}) as server:
        url = f"http://127.0.0.1:{server.serve_metrics('127.0.0.1', 0)}/metrics"
        with flightstore.connect(server.uri, timeout=60) as conn:
            conn.sql("CREATE TABLE secret_name (id BIGINT)")
            conn.table("secret_name").append({"id": [1, 2, 3]})
            conn.sql("SELECT * FROM secret_name")
        status, text = _get(url)
        assert status == 200
        assert "secret_name" not in text and 'table="' not in text
        samples = scrape(url)
        assert value(samples, "flightstore_rows_in_total") == 3
        assert value(samples, "flightstore_rows_out_total") == 3
        assert not any(name == "flightstore_log_end_offset" for name, _ in samples)


def test_handler_timed_calls_are_counted_once_with_the_status_the_client_gets(metered):
    """GetFlightInfo, DoPut and DoAction are timed by the RPC wrapper, not by a middleware
    instance: each call counts once, under the status its client got, with its duration, and a
    GetFlightInfo leaves the active queries as it found them."""
    server, url = metered
    with flightstore.connect(server.uri, username="admin", password="adm1n", timeout=60) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
        conn.table("kv").upsert({"id": [1, 2], "v": ["a", "b"]})
        protocol = flightstore.client.protocol

        def info(sql: str):
            command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
            return conn._client.get_flight_info(flight.FlightDescriptor.for_command(command), conn._options)

        before = scrape(url)
        for key in (1, 2, 3):
            info(f"SELECT * FROM kv WHERE id = {key}")
        with pytest.raises(pa.ArrowInvalid):
            info("SELECT * FROM kv WHERE")
        with pytest.raises(pa.ArrowKeyError):
            info("SELECT * FROM absent")
        with pytest.raises(NotImplementedError):
            list(conn._client.do_action(flight.Action("BeginTransaction", b""), conn._options))
        conn.table("kv").upsert({"id": [3], "v": ["c"]})
        after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("flightstore_rpc_total", method="GetFlightInfo", status="OK") == 3
    assert delta("flightstore_rpc_duration_seconds_count", method="GetFlightInfo", status="OK") == 3
    assert delta("flightstore_rpc_total", method="GetFlightInfo", status="INVALID_ARGUMENT") == 1
    assert delta("flightstore_rpc_total", method="GetFlightInfo", status="NOT_FOUND") == 1
    assert delta("flightstore_rpc_total", method="DoAction", status="UNIMPLEMENTED") == 1
    assert delta("flightstore_rpc_total", method="DoPut", status="OK") == 1
    assert delta("flightstore_rpc_duration_seconds_sum", method="DoPut", status="OK") > 0
    assert value(after, "flightstore_active_queries") == 0
