"""The Spark connector over TLS (and mutual TLS) with authentication: batch read and write, with the
certificates given as connector options (PEM file paths)."""

from __future__ import annotations

import threading

import pytest

import flightstore
from flightstore.server.service import FlightSqlServer
from flightstore.server.tls import TlsConfig
from flightstore.store import Store
from tests.certs import make_certificates

pytestmark = pytest.mark.slow


@pytest.fixture
def mtls_server(tmp_path):
    certs = make_certificates(tmp_path / "certs")
    store = Store(tmp_path / "data")
    server = FlightSqlServer(store, tls=TlsConfig.from_files(certs.server_cert, certs.server_key, certs.ca),
                             users={"etl": "pässwörd"}, super_users=("etl",))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server, certs
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def test_spark_reads_and_writes_over_mutual_tls(spark, mtls_server):
    server, certs = mtls_server
    options = {"uri": server.uri, "username": "etl", "password": "pässwörd", "tls.root.certs": str(certs.ca),
               "tls.cert.chain": str(certs.client_cert), "tls.private.key": str(certs.client_key)}
    client = {"username": "etl", "password": "pässwörd", "tls_root_certs": certs.ca, "cert_chain": certs.client_cert,
                  "private_key": certs.client_key, "timeout": 60}
    with flightstore.connect(server.uri, **client) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    df = spark.createDataFrame([(i, f"v{i}") for i in range(100)], "k long, v string")
    df.write.format("flightstore").options(table="kv", **options).mode("append").save()
    read = spark.read.format("flightstore").options(table="kv", **options).load()
    assert read.rdd.getNumPartitions() == 1  # 100 rows: one task
    assert sorted(tuple(r) for r in read.filter("k >= 98").collect()) == [(98, "v98"), (99, "v99")]
    with flightstore.connect(server.uri, **client) as conn:
        assert conn.table("kv").row_count() == 100
    # Without the client certificate the connector cannot connect.
    without = {k: v for k, v in options.items() if not k.startswith("tls.cert") and k != "tls.private.key"}
    with pytest.raises(Exception, match="(?i)unavailable|handshake|certificate|ssl|connect"):
        spark.read.format("flightstore").options(table="kv", **without).load().collect()
