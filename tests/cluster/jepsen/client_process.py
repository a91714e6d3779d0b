"""A client process of the Jepsen-style test: a *writer* or a *reader*, run as
``python -m tests.cluster.jepsen.client_process CONFIG.json`` until the stop file appears.

Writer: one writer id per table; each operation (:func:`workload.generate`) is retried with the
same writer id and sequence, through a random live server each time, until it is acknowledged or
its deadline passes; its outcome goes to the history (``ok`` / ``fail`` / ``unknown``, see
:mod:`.history`). Three routes: the Python client (``TableClient``: straight to each bucket's
leader), a DoPut to any server (which splits the batch by leader and forwards), and SQL INSERT
(once, no client retry: the server's statement writer makes its own retries apply once).

Reader: scans, lookups and ``$changelog`` reads through random servers, plus one subscription
thread per table that follows the changelog through a random server, resubscribing from the next
offset of every bucket whenever the stream breaks, stalls or is rotated. Everything seen goes to
the history with the bucket of each row, for the checker.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import flightstore
from flightstore.bucketing import bucket_ids
from tests.cluster.jepsen.history import HistoryWriter
from tests.cluster.jepsen.workload import BUCKETS, KEYS_PER_WRITER, PK_COLUMNS, Op, generate, op_table, pk_row

__all__ = ["CHANGELOG_COLUMNS", "bucket_of", "changes", "main", "rows_of"]

REFUSED = ("Connection refused", "Failed to connect", "failed to connect")


def bucket_of(keys: list[int]) -> list[int]:
    """The bucket of each key (every test table is bucketed by one BIGINT column)."""
    if not keys:
        return []
    return bucket_ids(pa.table({"k": pa.array(keys, pa.int64())}), ["k"], BUCKETS).tolist()


#: The columns each table's changes are read with (``_change_type`` and ``_log_offset`` added).
CHANGELOG_COLUMNS = {"lg": ["k", "w", "s", "i"], "pk": PK_COLUMNS, "agg": ["g", "v"]}


def rows_of(table: str, data: pa.Table | pa.RecordBatch, columns: list[str] | None = None) -> list[list]:
    """Rows as plain lists: a pk row as ``[k, a, b, op]`` of its owner (:func:`workload.pk_row`),
    others as ``columns``."""
    if table == "pk":
        return [pk_row(row) for row in data.select(PK_COLUMNS).to_pylist()]
    columns = columns or CHANGELOG_COLUMNS[table]
    return [list(row) for row in zip(*(data.column(c).to_pylist() for c in columns))] if data.num_rows else []


def changes(table: str, data: pa.Table | pa.RecordBatch) -> list[list]:
    """Changelog rows as ``[bucket, offset, change type, *row]`` (row as :func:`rows_of`)."""
    rows = rows_of(table, data)
    buckets = bucket_of([r[0] for r in rows])
    offsets, kinds = data.column("_log_offset").to_pylist(), data.column("_change_type").to_pylist()
    return [[b, o, c, *r] for b, o, c, r in zip(buckets, offsets, kinds, rows)]


def changelog_sql(table: str) -> str:
    return f"SELECT {', '.join(CHANGELOG_COLUMNS[table])}, _change_type, _log_offset FROM {table}$changelog"


class Endpoints:
    """The servers' URIs (the nemesis restarts servers on the same ports) and a connection each."""

    def __init__(self, uris: list[str], timeout: float) -> None:
        self.uris = uris
        self.timeout = timeout
        self._connections: dict[str, flightstore.Connection] = {}
        self._tables: dict[tuple[str, str, str], Any] = {}

    def connection(self, uri: str) -> flightstore.Connection:
        conn = self._connections.get(uri)
        if conn is None:
            conn = self._connections[uri] = flightstore.connect(uri, timeout=self.timeout)
        return conn

    def table(self, uri: str, name: str, writer: str) -> Any:
        key = (uri, name, writer)
        client = self._tables.get(key)
        if client is None:
            client = self._tables[key] = self.connection(uri).table(name, writer_id=writer)
        return client

    def forget(self, uri: str) -> None:
        """Drop what is cached for ``uri`` (connections, leader layouts) after a failure."""
        conn = self._connections.pop(uri, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a dead server's channel
                pass
        self._tables = {k: v for k, v in self._tables.items() if k[0] != uri}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".split("\n")[0][:300]


# ---- writer ---------------------------------------------------------------------------------
def _send(endpoints: Endpoints, uri: str, op: Op, writer: str, seq: int) -> None:
    method = {"append": "append", "add": "upsert", "delete": "delete"}.get(op.kind, "upsert")
    data = op.data()
    if op.via == "sql":
        values = ", ".join(f"({k}, '{w}', {s}, {i})" for k, w, s, i in zip(*(op.rows[c] for c in "kwsi")))
        endpoints.connection(uri).sql(f"INSERT INTO {op.table} VALUES {values}")
        return
    if op.via == "client":
        client = endpoints.table(uri, op.table, writer)
        client._sequence = seq - 1  # the retry carries the same sequence (TableClient numbers from it)
        result = getattr(client, method)(data, op.columns) if method != "append" else client.append(data)
    else:
        result = endpoints.connection(uri)._put({"op": method, "table": op.table, "columns": op.columns,
                                                 "writer_id": writer, "sequence": seq}, data)
    if result.get("sequence") not in (None, seq):
        raise AssertionError(f"the write was split into chunks (sequence {seq} -> {result['sequence']})")


def run_writer(config: dict[str, Any], history: HistoryWriter, stop: Path) -> None:
    proc = int(config["proc"])
    rng = random.Random(config["seed"] * 7919 + proc)
    endpoints = Endpoints(config["uris"], config["call_timeout_s"])
    seqs = {"lg": 0, "pk": 0, "agg": 0}
    while not stop.exists():
        table = op_table(rng)
        writer, seq = f"p{proc}-{table}", seqs[table]
        op = generate(rng, table, proc, writer, seq)
        history.write({"ev": "invoke", "proc": proc, "writer": writer, "seq": seq, "op": op.to_json()})
        deadline = time.monotonic() + config["op_deadline_s"]
        attempts, sent, error, outcome = 0, False, None, "unknown"
        while time.monotonic() < deadline:
            uri = rng.choice(endpoints.uris)
            attempts += 1
            try:
                _send(endpoints, uri, op, writer, seq)
                outcome = "ok"
                break
            except Exception as exc:  # noqa: BLE001 - every failure is recorded; the op is retried
                error = _error(exc)
                if op.via == "client" or not any(r in str(exc) for r in REFUSED):
                    sent = True
                endpoints.forget(uri)
                if op.via == "sql":  # a statement has no writer id of the client's: never retried
                    break
                time.sleep(rng.uniform(0.1, 0.5))
        if outcome != "ok":
            outcome = "unknown" if sent else "fail"
        history.write({"ev": "complete", "proc": proc, "writer": writer, "seq": seq, "outcome": outcome,
                       "attempts": attempts, "error": error if outcome != "ok" else None})
        seqs[table] = seq + 1


# ---- reader ---------------------------------------------------------------------------------
def _read_once(endpoints: Endpoints, uri: str, kind: str, rng: random.Random, writers: int) -> dict[str, Any]:
    conn = endpoints.connection(uri)
    if kind == "pk_scan":
        return {"table": "pk", "rows": rows_of("pk", conn.sql(f"SELECT {', '.join(PK_COLUMNS)} FROM pk"))}
    if kind == "pk_lookup":
        keys = [p * 1000 + rng.randrange(KEYS_PER_WRITER) for p in rng.sample(range(writers), min(2, writers))]
        found = endpoints.table(uri, "pk", "reader").lookup({"k": pa.array(keys, pa.int64())})
        return {"table": "pk", "keys": keys, "rows": rows_of("pk", found)}
    if kind == "lg_scan":
        return {"table": "lg", "rows": rows_of("lg", conn.sql("SELECT w, s, i FROM lg"), ["w", "s", "i"])}
    if kind == "agg_scan":
        return {"table": "agg", "rows": rows_of("agg", conn.sql("SELECT g, v FROM agg"))}
    # the pk changelog as SQL: each row with its bucket, to compare with the final changelog
    return {"table": "pk", "changelog": True, "rows": changes("pk", conn.sql(changelog_sql("pk")))}


def run_reads(config: dict[str, Any], history: HistoryWriter, stop: Path) -> None:
    rng = random.Random(config["seed"] * 7919 + 101)
    endpoints = Endpoints(config["uris"], config["call_timeout_s"])
    kinds = ("pk_scan", "pk_lookup", "pk_lookup", "lg_scan", "agg_scan", "pk_changelog")
    while not stop.exists():
        uri, kind = rng.choice(endpoints.uris), rng.choice(kinds)
        started = time.time()
        try:
            answer = _read_once(endpoints, uri, kind, rng, config["writers"])
            history.write({"ev": "read", "kind": kind, "via": uri, "t0": started, **answer})
        except Exception as exc:  # noqa: BLE001 - a read that fails tells nothing; recorded
            history.write({"ev": "read_error", "kind": kind, "via": uri, "error": _error(exc)})
            endpoints.forget(uri)
        time.sleep(rng.uniform(0.02, 0.15))  # leave the writers some of the machine


def run_subscription(config: dict[str, Any], table: str, history: HistoryWriter, stop: Path) -> None:
    """Follow ``table``'s changelog through random servers; every row goes to the history as
    ``[bucket, offset, change type, *columns]``; a stream that fails, goes silent for the stall
    time (no heartbeat either) or reaches its rotation time is replaced by one that starts at the
    next offset of every bucket."""
    rng = random.Random(config["seed"] * 7919 + {"lg": 201, "pk": 202}[table])
    columns = CHANGELOG_COLUMNS[table]
    following: dict[int, int] | None = None  # bucket -> next offset (None: from the earliest)
    while not stop.exists():
        uri = rng.choice(config["uris"])
        rotate_at = time.monotonic() + rng.uniform(8, 20)
        conn = None
        try:
            conn = flightstore.connect(uri, timeout=config["call_timeout_s"])
            start: Any = "earliest" if following is None else dict(following)
            subscription = conn.table(table).subscribe(start, columns=columns + ["_change_type", "_log_offset"])
            reader = subscription._reader
            last = [time.monotonic()]
            done = threading.Event()

            def watchdog(reader=reader, last=last, done=done) -> None:
                while not done.wait(0.5):
                    if (time.monotonic() - last[0] > config["stall_s"] or time.monotonic() > rotate_at
                            or stop.exists()):
                        reader.cancel()
                        return
            threading.Thread(target=watchdog, daemon=True).start()
            history.write({"ev": "subscribe", "table": table, "via": uri, "start": start})
            try:
                while True:
                    chunk = reader.read_chunk()
                    last[0] = time.monotonic()
                    batch = chunk.data
                    if batch is None or batch.num_rows == 0:
                        continue
                    rows = changes(table, batch)
                    history.write({"ev": "sub", "table": table, "via": uri, "rows": rows})
                    following = following if following is not None else {}
                    for b, o, *_ in rows:
                        following[b] = max(following.get(b, 0), o + 1)
            finally:
                done.set()
        except StopIteration:
            history.write({"ev": "sub_end", "table": table, "via": uri})
        except Exception as exc:  # noqa: BLE001 - the stream broke: resubscribe elsewhere
            history.write({"ev": "sub_error", "table": table, "via": uri, "error": _error(exc)})
            time.sleep(0.3)
        finally:
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass


def run_reader(config: dict[str, Any], history: HistoryWriter, stop: Path) -> None:
    threads = [threading.Thread(target=run_subscription, args=(config, t, history, stop), daemon=True)
               for t in ("lg", "pk")]
    for thread in threads:
        thread.start()
    run_reads(config, history, stop)
    for thread in threads:
        thread.join(config["call_timeout_s"] + 5)


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text("utf-8"))
    stop = Path(config["stop_file"])
    history = HistoryWriter(Path(config["history"]), config["name"])
    try:
        (run_writer if config["role"] == "writer" else run_reader)(config, history, stop)
    finally:
        history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
