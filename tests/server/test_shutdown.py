"""A server that shuts down says so, and a dead server is told from a quiet one.

Real ``flightstore serve`` processes, stopped with SIGTERM (and frozen with SIGSTOP). Each client
runs in its own process, reading in its main thread (where pyarrow turns a CANCELLED status into
KeyboardInterrupt): a running query and a subscription both end with UNAVAILABLE ("the server is
shutting down"), through flightstore's client and through plain pyarrow.flight. An idle
subscription receives heartbeats; flightstore's client raises when none arrives in time.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.errors import Unavailable
from flightstore.server import tickets
from flightstore.store import Store
from tests.server.conftest import ServerProcess
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 1.0
READY_TIMEOUT_S = 120  # a client process starting on a busy machine
TIMEOUT_S = 2.0  # a subscription's timeout in the heartbeat test (heartbeats every 0.1 s)


class Server(ServerProcess):
    """``flightstore serve`` on a free port (tests/server/conftest.py), killed at the end: the
    tests stop it themselves (SIGTERM) where the stop is what they check."""

    def stop(self) -> None:
        self.kill()  # SIGKILL ends a SIGSTOPped server too

    def signal(self, number: int) -> None:
        if self.alive():
            os.kill(self.pid, number)


def _table(data_dir: Path, rows: int = 20_000) -> None:
    with Store(data_dir, fsync=False) as store:
        ids = np.arange(rows, dtype=np.int64)
        store.create_table("t", pa.schema([("id", pa.int64()), ("v", pa.float64())]),
                           options={"bucket.num": "2"}).append(pa.table({"id": ids, "v": ids * 0.5}))
        store.create_table("quiet", pa.schema([("id", pa.int64())]), options={"bucket.num": "1"})


# Each client process holds a long query (a 400 M-row cross join: only the shutdown stops it) and a
# subscription of an idle table, says "ready", then reads each in its main thread until it ends.
FLIGHTSTORE_CLIENT = r'''
import json, sys
import flightstore
conn = flightstore.connect(sys.argv[1])
query = conn.sql_batches("SELECT a.id, b.id FROM t a, t b")
next(query)
subscription = iter(conn.table("quiet").subscribe("earliest", heartbeat_s=0.2, timeout_s=60))
print("ready", flush=True)
out = {}
for name, stream in (("query", query), ("subscription", subscription)):
    try:
        for _ in stream:
            pass
        out[name] = ["ended normally", ""]
    except BaseException as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out), flush=True)
'''

PYARROW_CLIENT = r'''
import json, sys
from pyarrow import flight
from flightstore.server import protocol, tickets
client = flight.FlightClient(sys.argv[1])
command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT a.id, b.id FROM t a, t b"))
info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
query = client.do_get(info.endpoints[0].ticket)
query.read_chunk()
payload = {"op": "subscribe", "table": "quiet", "start": "earliest", "heartbeat_s": 0.2}
info = client.get_flight_info(flight.FlightDescriptor.for_command(tickets.encode_custom(payload)))
subscription = client.do_get(info.endpoints[0].ticket)
subscription.read_chunk()  # a heartbeat: the subscription is open
print("ready", flush=True)
out = {}
for name, reader in (("query", query), ("subscription", subscription)):
    try:
        while True:
            reader.read_chunk()
    except StopIteration:
        out[name] = ["ended normally", ""]
    except BaseException as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out), flush=True)
'''


def _clients(scripts: list[str], uri: str) -> list[subprocess.Popen]:
    """Start a process per script (in parallel: each imports pyarrow) and wait until each is ready."""
    processes = [subprocess.Popen([sys.executable, "-c", script, uri], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT) for script in scripts]
    for process in processes:
        ready, _, _ = select.select([process.stdout], [], [], READY_TIMEOUT_S)
        first = process.stdout.readline() if ready else "(nothing: it hangs)"
        if first.strip() != "ready":
            for other in processes:
                other.kill()
            raise AssertionError(f"a client did not start: {first!r} {process.stderr.read()[-3000:]}")
    return processes


@pytest.mark.slow
def test_sigterm_ends_queries_and_subscriptions_with_unavailable(tmp_path) -> None:
    _table(tmp_path / "data")
    server = Server(tmp_path / "data", {"server.shutdown-grace": f"{GRACE_S:g}s", "query.timeout": "0"})
    clients = []
    try:
        clients = _clients([FLIGHTSTORE_CLIENT, PYARROW_CLIENT], server.uri)
        server.signal(signal.SIGTERM)
        answers = []
        for client in clients:
            out, err = client.communicate(timeout=GRACE_S + 60)
            assert client.returncode == 0, err[-3000:]
            answers.append(json.loads(out.strip().splitlines()[-1]))
        assert server.wait(60) == 0
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
        server.stop()
    flightstore_client, pyarrow_client = answers
    for answer in answers:
        for stream in ("query", "subscription"):
            kind, message = answer[stream]
            assert kind == "FlightUnavailableError", (stream, answer)
            assert "server is shutting down" in message, (stream, answer)
    assert flightstore_client["query"][1].count("the query was stopped") >= 1
    assert "the subscription ended" in pyarrow_client["subscription"][1]


def test_an_idle_subscription_gets_heartbeats_and_a_dead_server_is_detected(tmp_path) -> None:
    _table(tmp_path / "data", rows=10)
    server = Server(tmp_path / "data", {})
    conn = flightstore.connect(server.uri)
    try:
        # plain pyarrow sees the heartbeats: empty batches while nothing is written
        payload = {"op": "subscribe", "table": "quiet", "start": "earliest", "heartbeat_s": 0.1}
        descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom(payload))
        client = flight.FlightClient(server.uri)
        deadline = flight.FlightCallOptions(timeout=60)  # without heartbeats a read would wait forever
        raw = client.do_get(client.get_flight_info(descriptor, deadline).endpoints[0].ticket, deadline)

        # flightstore's client: a quiet server (heartbeats, no data for longer than timeout_s) is
        # no error; the row written after that arrives
        subscription = conn.table("quiet").subscribe("earliest", heartbeat_s=0.1, timeout_s=TIMEOUT_S)
        got: list = []
        failed: list = []

        def consume() -> None:
            try:
                for batch in subscription:
                    got.extend(batch.column("id").to_pylist())
            except Exception as exc:  # noqa: BLE001 - the test reads it
                failed.append(exc)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        started = time.monotonic()
        heartbeats = 0
        while time.monotonic() - started < 2 * TIMEOUT_S:  # idle for twice timeout_s
            chunk = raw.read_chunk()
            assert chunk.data.num_rows == 0
            heartbeats += 1
        assert heartbeats >= 2 * TIMEOUT_S / 0.1 / 4  # about one per heartbeat_s, on a busy machine too
        conn.sql("INSERT INTO quiet VALUES (7)")
        wait_until(lambda: got or failed, "the written row reaching the subscriber", timeout=60)
        assert failed == [] and got == [7]

        # a server that stops answering (frozen) is told from a quiet one: the subscription raises
        server.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        consumer.join(timeout=60)
        assert not consumer.is_alive()
        assert len(failed) == 1 and isinstance(failed[0], Unavailable), failed
        assert f"no data and no heartbeat from the server for {TIMEOUT_S:g} s" in str(failed[0])
        assert time.monotonic() - frozen >= TIMEOUT_S - 0.5  # the last heartbeat came just before
        client.close()
    finally:
        server.signal(signal.SIGCONT)
        conn.close()
        server.stop()


def test_subscription_options_are_checked(server) -> None:
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE quiet (id BIGINT)")
        with pytest.raises(flightstore.errors.InvalidOption, match="longer than heartbeat_s"):
            conn.table("quiet").subscribe(heartbeat_s=2.0, timeout_s=1.0)
        payload = {"op": "subscribe", "table": "quiet", "start": "earliest", "heartbeat_s": 0}
        client = flight.FlightClient(server.uri)
        with pytest.raises(pa.ArrowInvalid, match="heartbeat_s must be a positive number"):
            client.get_flight_info(flight.FlightDescriptor.for_command(tickets.encode_custom(payload)))
        client.close()


def test_closing_a_subscription_from_another_thread_ends_its_consumer_at_once(server) -> None:
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE quiet (id BIGINT)")
        subscription = conn.table("quiet").subscribe("earliest", heartbeat_s=0.1, timeout_s=30)
        ended: list = []

        def consume() -> None:
            try:
                for _ in subscription:
                    pass
                ended.append("end")
            except Exception as exc:  # noqa: BLE001 - the test reads it
                ended.append(exc)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        wait_until(lambda: subscription._thread is not None, "the subscription reading")
        closed = time.monotonic()
        subscription.close()
        consumer.join(timeout=60)
        assert not consumer.is_alive() and len(ended) == 1
        assert ended == ["end"] or isinstance(ended[0], flight.FlightCancelledError), ended
        assert time.monotonic() - closed < 20  # not the 30 s of timeout_s


def test_a_subscription_left_with_break_ends_its_stream_and_the_server_stops(tmp_path):
    """The README's loop (``for batch in t.subscribe(...): ... break``) never calls close(): the
    dropped subscription ends its reading thread and its stream, and an in-process server then
    shuts down cleanly (an open stream aborted the test process at shutdown)."""
    from tests.server.conftest import RunningServer
    running = RunningServer(tmp_path / "data")
    try:
        with flightstore.connect(running.uri, timeout=60) as conn:
            conn.sql("CREATE TABLE ev (k BIGINT)")
            conn.table("ev").append({"k": [1, 2, 3]})
            for batch in conn.table("ev").subscribe("earliest"):
                assert batch.num_rows
                break
            wait_until(lambda: not any(t.name == "flightstore-subscription" and t.is_alive()
                                       for t in threading.enumerate()), "the dropped subscription's thread ending")
    finally:
        running.stop()


# In its own process: the bug this guards against crashed the process (SIGSEGV/SIGABRT), which
# would take a test worker down with it.
GOAWAY_RACE = r'''
import sys, tempfile, threading, time
import flightstore
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

for round_ in range(int(sys.argv[1])):
    store = Store(tempfile.mkdtemp() + "/data", fsync=False)
    server = FlightSqlServer(store, "grpc://127.0.0.1:0")
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE t (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        conn.table("t").upsert({"id": [1, 2]})
    clients = [flightstore.connect(server.uri) for _ in range(24)]
    for client in clients:
        client.table("t").lookup({"id": [1]})  # each opens a lookup stream
    closing = [threading.Thread(target=client.close) for client in clients]
    for thread in closing:
        thread.start()
    time.sleep((round_ % 10) * 0.0005)  # shutdown's GOAWAY lands at varying points of the closes
    server.shutdown(grace_s=1)
    for thread in closing:
        thread.join()
    serving.join(10)
    store.close()
'''


def test_shutdown_racing_lookup_streams_that_close_never_crashes_the_process() -> None:
    """Shutdown sends GOAWAY on every open lookup stream while clients close theirs: a stream whose
    handler had returned was written to after gRPC finished its call, which crashed the server
    (SIGSEGV or SIGABRT within 50 rounds before the fix; it took a CI test worker down)."""
    done = subprocess.run([sys.executable, "-c", GOAWAY_RACE, "60"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
