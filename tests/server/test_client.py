"""The Python client against a real server: SQL, writes, lookups, scans, subscriptions."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.expressions import Comparison
from flightstore.server import protocol, tickets
from tests.waiting import distinct_millisecond, wait_until


def test_client_round_trip(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE users (id BIGINT, name STRING, score DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
                 "WITH ('bucket.num' = '3')")
        users = conn.table("users")
        users.upsert(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "score": [1.0, 2.0, 3.0]}))
        users.upsert(pa.table({"id": [2], "score": [20.0]}), columns=["id", "score"])
        users.delete(pa.table({"id": [3]}))
        assert users.lookup({"id": [2, 1, 3]}).to_pylist() == [
            {"id": 2, "name": "b", "score": 20.0}, {"id": 1, "name": "a", "score": 1.0}]
        assert users.prefix_lookup({"id": [1]}, columns=["name"]).to_pylist() == [{"name": "a"}]
        assert users.row_count() == 2
        scanned = users.scan(columns=["id"], filter=Comparison("score", ">", 5))
        assert scanned.column("id").to_pylist() == [2]
        assert conn.sql("SELECT COUNT(*) AS n FROM users").to_pylist() == [{"n": 2}]
        assert conn.execute("INSERT INTO users VALUES (9, 'z', 0.5)") == 1
        assert users.row_count() == 3


def test_retried_write_is_applied_once(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE events (id BIGINT, v STRING)")
        events = conn.table("events", writer_id="job-1")
        events.append({"id": [1, 2], "v": ["a", "b"]})
        # Simulate a lost acknowledgement: the same batch is sent again with the same sequence.
        events._sequence -= 1
        answer = events.append({"id": [1, 2], "v": ["a", "b"]})
        assert answer["duplicate"]
        assert events.row_count() == 2
        # A new client with the same writer id continues after the stored sequence.
        again = conn.table("events", writer_id="job-1")
        again.append({"id": [3], "v": ["c"]})
        assert events.row_count() == 3


def test_subscriber_sees_every_change_once_in_order(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num'='2')")
        kv = conn.table("kv")
        seen: list[pa.RecordBatch] = []
        total_changes = []

        def writer() -> None:
            with flightstore.connect(server.uri, timeout=120) as wconn:
                t = wconn.table("kv")
                for i in range(30):
                    t.upsert({"k": [i % 7, (i + 3) % 7], "v": [i, i]})
                total_changes.append(t.offsets())

        subscription = kv.subscribe("earliest")
        thread = threading.Thread(target=writer)
        thread.start()
        thread.join()
        ends = total_changes[0]
        expected_rows = sum(ends.values())
        for batch in subscription:
            seen.append(batch)
            if sum(b.num_rows for b in seen) >= expected_rows:
                break
        subscription.close()
        changes = pa.Table.from_batches(seen)
        assert changes.num_rows == expected_rows
        # Per bucket, offsets are exactly 0..end-1 in order: every change once, in order.
        buckets = {}
        for row in changes.select(["k", "_log_offset"]).to_pylist():
            buckets.setdefault(row["k"], []).append(row["_log_offset"])
        offsets = changes.column("_log_offset").to_pylist()
        assert sorted(offsets) == sorted(o for b, end in ends.items() for o in range(end))
        # Folding the subscribed changelog gives the table's state.
        state = {}
        for row in changes.to_pylist():
            if row["_change_type"] in ("+I", "+U"):
                state[row["k"]] = row["v"]
            elif row["_change_type"] == "-D":
                state.pop(row["k"])
        assert state == {r["k"]: r["v"] for r in conn.sql("SELECT k, v FROM kv").to_pylist()}


def _drain(subscription, rows):
    got = []
    for batch in subscription:
        got.extend(batch.to_pylist())
        if len(got) >= rows:
            break
    subscription.close()
    return got


def test_subscription_start_modes_and_column_pruning(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE ev (id BIGINT, payload STRING, n DOUBLE)")
        ev = conn.table("ev")
        ev.append({"id": [1, 2], "payload": ["a", "b"], "n": [1.0, 2.0]})
        middle_ms = distinct_millisecond()
        ev.append({"id": [3], "payload": ["c"], "n": [3.0]})
        ends = ev.offsets()
        # earliest, pruned to two columns (+ offsets)
        got = _drain(ev.subscribe("earliest", columns=["id", "_log_offset"]), 3)
        assert [r["id"] for r in got] == [1, 2, 3]
        assert set(got[0]) == {"id", "_log_offset"}
        # timestamp: only the record committed after middle_ms
        assert [r["id"] for r in _drain(ev.subscribe({"timestamp": middle_ms}, columns=["id"]), 1)] == [3]
        # explicit per-bucket offsets
        assert [r["id"] for r in _drain(ev.subscribe({0: 2}, columns=["id"]), 1)] == [3]
        # bounded: `until` ends the stream by itself
        bounded = list(ev.subscribe("earliest", columns=["id"], until={0: 2}))
        assert [r["id"] for b in bounded for r in b.to_pylist()] == [1, 2]
        # latest: only what is written after subscribing
        latest = ev.subscribe("latest", columns=["id", "_change_type"])
        ev.append({"id": [4], "payload": ["d"], "n": [4.0]})
        assert _drain(latest, 1) == [{"id": 4, "_change_type": "+A"}]
        assert ends == {0: 3}


def test_latest_is_fixed_when_the_flight_info_is_answered(server):
    """Issue 10 #8: "latest" is resolved at GetFlightInfo. Rows appended between GetFlightInfo and
    DoGet (a client slow to start reading) are delivered, every time, in every bucket."""
    from pyarrow import flight

    from flightstore.server import tickets

    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE TABLE late (id BIGINT) WITH ('bucket.num' = '2')")
        late = conn.table("late")
        late.append({"id": [0]})
        client = flight.FlightClient(server.uri)
        options = flight.FlightCallOptions(timeout=60)
        command = tickets.encode_custom({"op": "subscribe", "table": "late", "columns": ["id"],
                                         "start": "latest", "until": None})
        misses = 0
        for attempt in range(1, 13):
            info = client.get_flight_info(flight.FlightDescriptor.for_command(command), options)
            late.append({"id": [attempt]})  # after the FlightInfo, before the stream runs
            late.append({"id": [attempt + 100]})  # round-robin: the other bucket
            # Bound the stream at the current ends so that it finishes by itself.
            payload = tickets.decode_custom(info.endpoints[0].ticket.ticket)
            payload["until"] = {str(b): o for b, o in late.offsets().items()}
            reader = client.do_get(flight.Ticket(tickets.encode_custom(payload)), options)
            seen = reader.read_all().column("id").to_pylist()
            misses += sorted(seen) != [attempt, attempt + 100]
        assert misses == 0
        client.close()


def test_wide_writes_are_sent_in_messages_below_the_grpc_limit(server):
    import numpy as np

    with flightstore.connect(server.uri, timeout=120) as conn:
        columns = ", ".join(f"c{i} DOUBLE" for i in range(100))
        conn.sql(f"CREATE TABLE wide ({columns})")
        rows = 60_000  # 48 MB in one table: several times the 16 MiB message limit
        data = pa.table({f"c{i}": np.full(rows, float(i)) for i in range(100)})
        conn.table("wide").append(data)
        assert conn.sql("SELECT COUNT(*) AS n, SUM(c99) AS s FROM wide").to_pylist() == [
            {"n": rows, "s": 99.0 * rows}]


def test_use_database_sets_the_default_and_refuses_unknown_ones(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE DATABASE shop")
        conn.sql("USE shop")
        conn.sql("CREATE TABLE t (a BIGINT)")
        assert server.store.list_tables("shop") == ["t"]
        with pytest.raises(pa.ArrowKeyError, match="database 'nope' does not exist"):
            conn.sql("USE nope")
        conn.sql("INSERT INTO t VALUES (1)")  # still in shop
        assert server.store.table("shop.t").row_count() == 1


def test_use_holds_for_its_own_connection_only(server):
    with flightstore.connect(server.uri, timeout=120) as shop, flightstore.connect(server.uri, timeout=120) as other:
        shop.sql("CREATE DATABASE shop")
        shop.sql("USE shop")
        other.sql("CREATE TABLE t (a BIGINT)")  # still in default
        shop.sql("CREATE TABLE t (a BIGINT)")
        other.sql("INSERT INTO t VALUES (1), (2)")
        shop.sql("INSERT INTO t VALUES (3)")
        assert other.sql("SELECT a FROM t ORDER BY a").column("a").to_pylist() == [1, 2]
        assert shop.sql("SELECT a FROM t").column("a").to_pylist() == [3]
        assert server.store.table("default.t").row_count() == 2
        assert server.store.table("shop.t").row_count() == 1


def _rpcs(server, method: str, status: str = "OK") -> float:
    return server.server.metrics.registry.get_sample_value(
        "flightstore_rpc_total", {"method": method, "status": status}) or 0.0


def test_sql_is_one_doget_of_a_statement_ticket_in_the_connections_session(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        conn.sql("CREATE DATABASE shop")
        conn.sql("USE shop")  # the ticket carries only the statement: the session names the database
        conn.sql("CREATE TABLE t (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '3')")
        assert conn.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')").to_pylist() == \
            [{"rows_affected": 4}]
        assert server.store.table("shop.t").row_count() == 4
        wait_until(lambda: _rpcs(server, "DoGet") == 4, "the four statements counted")
        infos, gets = _rpcs(server, "GetFlightInfo"), _rpcs(server, "DoGet")
        assert conn.sql("SELECT v FROM t WHERE id = 3").to_pylist() == [{"v": "c"}]  # answered at once
        assert conn.sql("SELECT * FROM t WHERE id = 99").num_rows == 0
        scanned = conn.sql("SELECT * FROM t")  # streamed from every bucket
        assert sorted(scanned.column("id").to_pylist()) == [1, 2, 3, 4]
        assert conn.sql("SELECT COUNT(*) AS n FROM t").to_pylist() == [{"n": 4}]
        # One RPC per statement, and the same answer as Flight SQL's GetFlightInfo + DoGet.
        wait_until(lambda: _rpcs(server, "DoGet") == gets + 4, "one DoGet per statement")
        assert _rpcs(server, "GetFlightInfo") == infos == 0
        command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT * FROM t"))
        info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(command), conn._options)
        assert conn.read_info(info).sort_by("id").equals(scanned.sort_by("id"))
        # Per-bucket endpoints asked for: sql() takes the FlightInfo to read each bucket where it names.
        conn.set_session_options({"flightstore.per-bucket-endpoints": True})
        assert sorted(conn.sql("SELECT id FROM t").column("id").to_pylist()) == [1, 2, 3, 4]
        wait_until(lambda: _rpcs(server, "GetFlightInfo") == 2, "sql() asking for the per-bucket FlightInfo")


@pytest.mark.parametrize("ticket, message", [
    (tickets.encode_custom({"op": "sql"}), "needs the statement as a non-empty string"),
    (tickets.encode_custom({"op": "sql", "sql": 42}), "needs the statement as a non-empty string"),
    (tickets.encode_custom({"op": "sql", "sql": "  "}), "needs the statement as a non-empty string"),
    (tickets.CUSTOM_PREFIX + b'{"op": "sql", "sql": ', "malformed flightstore command"),
    (tickets.encode_custom({"op": "sql", "sql": "SELECT * FROM"}), "syntax error"),
    (tickets.encode_custom({"op": "sql", "sql": "SELECT * FROM missing WHERE id = 1"}), "missing"),
], ids=["no sql", "not a string", "blank", "not json", "syntax error", "unknown table"])
def test_a_bad_sql_ticket_is_invalid_argument_and_the_server_keeps_serving(server, ticket, message):
    with flightstore.connect(server.uri, timeout=120) as conn:
        with pytest.raises((pa.ArrowInvalid, pa.ArrowKeyError), match=message) as refused:
            conn._client.do_get(flight.Ticket(ticket), conn._options).read_all()
        if "missing" in message:
            assert isinstance(refused.value, pa.ArrowKeyError)  # NOT_FOUND
        else:
            assert isinstance(refused.value, pa.ArrowInvalid)  # INVALID_ARGUMENT
        assert conn.sql("SHOW DATABASES").column(0).to_pylist() == ["default"]


def test_a_sql_ticket_sent_to_get_flight_info_is_refused(server):
    with flightstore.connect(server.uri, timeout=120) as conn:
        descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom({"op": "sql", "sql": "SHOW DATABASES"}))
        with pytest.raises(pa.ArrowInvalid, match="DoGet ticket"):
            conn._client.get_flight_info(descriptor, conn._options)
