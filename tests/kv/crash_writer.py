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
