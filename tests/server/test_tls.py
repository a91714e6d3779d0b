"""TLS and mutual TLS with certificates made in the test: the Python client, ADBC and the CLI."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading

import adbc_driver_flightsql as adbc_flightsql
import adbc_driver_manager
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.errors import InvalidInput
from flightstore.server.service import FlightSqlServer
from flightstore.server.tls import TlsConfig
from flightstore.store import Store
from tests.certs import make_certificates

OPTIONS = adbc_flightsql.DatabaseOptions


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _serve(tmp_path, certs, *, mutual: bool, **kwargs):
    store = Store(tmp_path / "data")
    tls = TlsConfig.from_files(certs.server_cert, certs.server_key, certs.ca if mutual else None)
    server = FlightSqlServer(store, tls=tls, **kwargs)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return store, server, thread


@pytest.fixture
def tls_server(tmp_path, certs):
    store, server, thread = _serve(tmp_path, certs, mutual=False, users={"alice": "s3cret"},
                                   super_users=("alice",))
    yield server
    server.shutdown()
    thread.join(timeout=10)
    store.close()


@pytest.fixture
def mtls_server(tmp_path, certs):
    store, server, thread = _serve(tmp_path, certs, mutual=True)
    yield server
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def _adbc(uri: str, certs, **extra: str):
    kwargs = {OPTIONS.TLS_ROOT_CERTS.value: certs.ca.read_text(), **extra}
    return dbapi.connect(uri, db_kwargs=kwargs, autocommit=True)


def test_python_client_and_adbc_over_tls_with_auth(tls_server, certs):
    assert tls_server.uri.startswith("grpc+tls://")
    with flightstore.connect(tls_server.uri, username="alice", password="s3cret", tls_root_certs=certs.ca,
                             timeout=30) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED)")
        conn.table("t").upsert({"id": [1, 2], "v": ["a", "b"]})
        assert conn.table("t").lookup({"id": [2]}).column("v").to_pylist() == ["b"]
    with _adbc(tls_server.uri, certs, username="alice", password="s3cret") as conn, conn.cursor() as cur:
        cur.execute("SELECT v FROM t WHERE id = ?", (1,))
        assert cur.fetchall() == [("a",)]
        cur.adbc_ingest("t", pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]}), mode="append")
        cur.execute("SELECT id, v FROM t ORDER BY id")
        assert cur.fetchall() == [(1, "a"), (2, "b"), (3, "c")]


def test_tls_server_refuses_what_cannot_verify_or_speaks_plaintext(tls_server, certs):
    port = tls_server.port
    with flightstore.connect(f"grpc://127.0.0.1:{port}", timeout=10) as plain, \
            pytest.raises(flight.FlightUnavailableError):
        plain.sql("SELECT 1")
    # No CA given: the system roots do not know the test CA, the handshake fails.
    with flightstore.connect(tls_server.uri, timeout=10) as unverified, \
            pytest.raises(flight.FlightUnavailableError):
        unverified.sql("SELECT 1")
    with pytest.raises(adbc_driver_manager.Error), \
            dbapi.connect(tls_server.uri, db_kwargs={"username": "alice", "password": "s3cret"},
                          autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")


def test_mutual_tls_accepts_a_signed_client_and_refuses_others(mtls_server, certs):
    with flightstore.connect(mtls_server.uri, tls_root_certs=certs.ca, cert_chain=certs.client_cert,
                             private_key=certs.client_key, timeout=30) as conn:
        conn.sql("CREATE TABLE t (id BIGINT)")
        conn.sql("INSERT INTO t VALUES (7)")
    with _adbc(mtls_server.uri, certs, **{OPTIONS.MTLS_CERT_CHAIN.value: certs.client_cert.read_text(),
                                          OPTIONS.MTLS_PRIVATE_KEY.value: certs.client_key.read_text()}
               ) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM t")
        assert cur.fetchall() == [(7,)]
    refused = [{},  # no client certificate
               {"cert_chain": certs.rogue_cert, "private_key": certs.rogue_key}]  # signed by an unknown CA
    for extra in refused:
        with flightstore.connect(mtls_server.uri, tls_root_certs=certs.ca, timeout=10, **extra) as conn, \
                pytest.raises(flight.FlightError):
            conn.sql("SELECT id FROM t")
    with pytest.raises(adbc_driver_manager.Error), _adbc(mtls_server.uri, certs) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM t")
    # Nothing the refused clients sent reached the table.
    with flightstore.connect(mtls_server.uri, tls_root_certs=certs.ca, cert_chain=certs.client_cert,
                             private_key=certs.client_key, timeout=30) as conn:
        assert conn.sql("SELECT id FROM t").column("id").to_pylist() == [7]


def test_serve_cli_over_mutual_tls(tmp_path, certs):
    process = subprocess.Popen(
        [sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"), "--port", "0",
         "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
         "--tls-client-ca", str(certs.ca)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert " at grpc+tls://127.0.0.1:" in line, (line, process.stderr.read() if process.poll() else "")
        uri = line.split(" at ", 1)[1].strip()
        with flightstore.connect(uri, tls_root_certs=certs.ca, cert_chain=certs.client_cert,
                                 private_key=certs.client_key, timeout=30) as conn:
            assert conn.sql("SELECT 40 + 2 AS x").column("x").to_pylist() == [42]
        with flightstore.connect(uri, tls_root_certs=certs.ca, timeout=10) as conn, \
                pytest.raises(flight.FlightError):
            conn.sql("SELECT 1")
    finally:
        process.terminate()
        process.wait(timeout=30)
    bad = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "d2"),
                          "--tls-cert", str(certs.server_cert)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode != 0 and "--tls-key" in bad.stderr


def test_serve_says_what_is_wrong_with_its_tls_key_or_port(tmp_path, certs):
    """Start-up failures name their cause (gRPC says only "Server did not start properly")."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        runs = [subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / name),
                                  *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name, args in [("a", ["--port", "0", "--tls-cert", str(certs.server_cert),
                                          "--tls-key", str(certs.client_key)]),   # the key of another certificate
                                   ("b", ["--port", str(port)])]]                  # a port another process holds
        errors = []
        for run in runs:
            _, error = run.communicate(timeout=180)
            assert run.returncode != 0, error
            errors.append(error)
    mismatch, in_use = errors
    assert f"the TLS key {certs.client_key} does not belong to the TLS certificate {certs.server_cert}" in mismatch
    assert "port" not in mismatch
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use by another process" in in_use


def test_tls_files_are_checked_before_listening(tmp_path, certs):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    for cert, key_file, ca, words in [
            (certs.server_cert, encrypted, None, "is encrypted with a passphrase"),
            (certs.server_key, certs.server_key, None, f"the TLS certificate {certs.server_key} holds no readable"),
            (certs.server_cert, certs.client_key, None, "does not belong to the TLS certificate"),
            (certs.server_cert, certs.server_key, certs.client_key, f"the client CA {certs.client_key} holds no"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(words)):
            TlsConfig.from_files(cert, key_file, ca)
    assert TlsConfig.from_files(certs.server_cert, certs.server_key, certs.ca).client_ca is not None
