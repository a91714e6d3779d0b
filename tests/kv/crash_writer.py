"""Child process of the crash test: writes batches in a loop and prints each acknowledged sequence.

Usage: python -m tests.kv.crash_writer DATA_DIR FIRST_SEQUENCE
Batch ``s`` upserts keys (s*7 + i) % 500 with value s into the PK table and appends 20 rows tagged
``s`` to the log table, both under writer id "crash" with sequence s.
"""

from __future__ import annotations

import sys

import pyarrow as pa

from flightstore.store import Store

PK_SCHEMA = pa.schema([("k", pa.int64()), ("seq", pa.int64()), ("pad", pa.string())])
LOG_SCHEMA = pa.schema([("seq", pa.int64()), ("i", pa.int64())])
ROWS = 20


def batch(sequence: int) -> tuple[pa.Table, pa.Table]:
    keys = [(sequence * 7 + i) % 500 for i in range(ROWS)]
    pk = pa.table({"k": pa.array(keys, pa.int64()), "seq": pa.array([sequence] * ROWS, pa.int64()),
                   "pad": ["x" * 200] * ROWS}, schema=PK_SCHEMA)
    log = pa.table({"seq": pa.array([sequence] * ROWS, pa.int64()),
                    "i": pa.array(range(ROWS), pa.int64())}, schema=LOG_SCHEMA)
    return pk, log


def main() -> None:
    data_dir, first = sys.argv[1], int(sys.argv[2])
    with Store(data_dir) as store:
        pk_table = store.create_table("default.kv", PK_SCHEMA, primary_key=["k"],
                                      options={"bucket.num": 3, "table.log.segment.bytes": 65536},
                                      if_not_exists=True)
        log_table = store.create_table("default.events", LOG_SCHEMA,
                                       options={"bucket.num": 2, "bucket.key": "i",
                                                "table.log.segment.bytes": 65536},
                                       if_not_exists=True)
        print("ready", flush=True)
        sequence = first
        while True:
            pk, log = batch(sequence)
            pk_table.upsert(pk, writer_id="crash", sequence=sequence)
            log_table.append(log, writer_id="crash", sequence=sequence)
            print(sequence, flush=True)
            sequence += 1


if __name__ == "__main__":
    main()


# ---- the server's crash test: kill -9 of a real server under 8 client writers -------------------
# (tests/kv/test_aggregation_exactly_once.py). Both functions run in processes forked from a
# multiprocessing fork server that imported flightstore once, so a restart costs no imports.

CLIENT_EVENTS = 12  # events per batch (aggregation table, tests/kv/agg_writer.py) and log rows per batch


def client_batch(writer: int, sequence: int) -> tuple[pa.Table, pa.Table]:
    """Batch ``sequence`` of client writer ``writer``: events of the aggregation table (ids unique
    to the writer and batch) and log rows tagged with the batch's global id."""
    from tests.kv import agg_writer
    first = (writer * 1_000_000 + sequence) * CLIENT_EVENTS
    events = pa.Table.from_pylist([agg_writer.event(i) for i in range(first, first + CLIENT_EVENTS)],
                                  schema=agg_writer.SCHEMA)
    log = pa.table({"seq": pa.array([writer * 1_000_000 + sequence] * CLIENT_EVENTS, pa.int64()),
                    "i": pa.array(range(CLIENT_EVENTS), pa.int64())}, schema=LOG_SCHEMA)
    return events, log


def serve_process(data_dir: str, port: int) -> None:
    """`flightstore serve --no-fsync` on ``port`` (kill -9 keeps the page cache, so what was
    written survives without fsync), its output discarded."""
    import os

    from flightstore import cli
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    cli.main(["serve", "--data-dir", data_dir, "--port", str(port), "--no-fsync"])


def client_writer_process(uri: str, writer: int, acked, stop, failures) -> None:
    """Writer ``writer`` (writer id ``w<n>`` in both tables): batch after batch into the
    aggregation table ``stats`` and the log table ``events``, counting in ``acked[writer]`` the
    batches both tables acknowledged, until ``stop`` is set. A write that raises is sent again, as
    an application does; only a DeliveryTimeout is reported (in ``failures``)."""
    from pyarrow import flight

    import flightstore
    from flightstore.errors import DeliveryTimeout
    with flightstore.connect(uri) as conn:
        tables = conn.table("stats", writer_id=f"w{writer}"), conn.table("events", writer_id=f"w{writer}")
        sequence = 0
        while not stop.is_set():
            for table, rows in zip(tables, client_batch(writer, sequence)):
                while True:
                    try:
                        table.upsert(rows) if table.name == "stats" else table.append(rows)
                        break
                    except flight.FlightError:
                        continue  # the application sends the batch again
                    except DeliveryTimeout as exc:
                        failures.put(f"writer {writer}: {exc}")
                        return
            sequence += 1
            acked[writer] = sequence
