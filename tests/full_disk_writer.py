"""Child process of tests/test_all_or_nothing.py: a multi-bucket write whose last bucket cannot be
appended to because the file-size limit (RLIMIT_FSIZE, which needs no root) makes its log segment
"full": the log append fails with a real EFBIG from the kernel, as with a full disk.

Usage: python -m tests.full_disk_writer DATA_DIR MODE
MODE ``retry``: after the failure, lift the limit and retry the same batch (same writer id and
sequence), then write the next one. MODE ``crash``: exit at once (os._exit) with the write
pending. MODE ``reopen``: close and reopen the store while still limited, then lift the limit and
write on. MODE ``alter``: add a column to both tables while the write is pending, then as
``retry``. Prints one JSON line per step: ``{"step": ..., ...}``.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import numpy as np
import pyarrow as pa

from flightstore.alter import AddColumns
from flightstore.errors import WriteIncomplete
from flightstore.store import Store

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("pad", pa.string())])
OPTIONS = {"bucket.num": 4, "table.merge-engine": "aggregation", "fields.n.agg": "sum",
           "fields.pad.agg": "last_value_ignore_nulls"}
LOG_OPTIONS = {"bucket.num": 4, "bucket.key": "id"}
KEYS = 16
LIMIT = 256 * 1024
WRITER = "w"


def say(step: str, **fields) -> None:
    print(json.dumps({"step": step, **fields}), flush=True)


def rows(n: int, pad: str | None = None, keys=range(KEYS)) -> pa.Table:
    keys = list(keys)
    return pa.table({"id": pa.array(keys, pa.int64()), "n": pa.array([n] * len(keys), pa.int64()),
                     "pad": pa.array([pad] * len(keys), pa.string())}, schema=SCHEMA)


def state(store: Store) -> dict:
    sums = {r["id"]: r["n"] for r in store.table("agg").scan_table(["id", "n"]).to_pylist()}
    events = store.table("ev").scan_table(["id"]).num_rows
    return {"sums": [sums.get(k) for k in range(KEYS)], "events": events}


def limit(size: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def write(store: Store, sequence: int, n: int) -> dict:
    """Batch ``sequence``: ``n`` added to every key, and ``KEYS`` events, under writer ``w``."""
    outcome = {}
    for name, call in (("agg", lambda t: t.upsert(rows(n), writer_id=WRITER, sequence=sequence)),
                       ("ev", lambda t: t.append(rows(n), writer_id=WRITER, sequence=sequence))):
        try:
            outcome[name] = "duplicate" if call(store.table(name)).duplicate else "written"
        except WriteIncomplete as exc:
            outcome[name] = f"incomplete: {exc}"
    return outcome


def main() -> None:
    data_dir, mode = sys.argv[1], sys.argv[2]
    store = Store(data_dir, fsync=False)
    agg = store.create_table("agg", SCHEMA, primary_key=["id"], options=OPTIONS)
    ev = store.create_table("ev", SCHEMA, options=LOG_OPTIONS)
    last = int(np.flatnonzero(np.bincount(agg.buckets_of(rows(0)), minlength=4))[-1])
    big = [k for k in range(KEYS, 10 * KEYS) if agg.buckets_of(rows(0, keys=[k]))[0] == last][:4]
    for table in (agg, ev):  # fill the last bucket's log segment past the limit: it is "full"
        assert int(table.buckets_of(rows(0, keys=big))[0]) == last
        table.upsert(rows(0, "x" * (LIMIT // 3), big)) if table is agg else table.append(
            rows(0, "x" * (LIMIT // 3), big))
    agg.snapshot(force=True)  # RocksDB flushed: its write-ahead logs stay small, only the log is big
    say("ready", bucket=last, **write(store, 0, 1))
    limit(LIMIT)
    say("failed", **write(store, 1, 10), **state(store))
    say("refused", **write(store, 2, 100))
    if mode == "crash":
        os._exit(0)
    if mode == "alter":  # the pending write was recorded under the schema before
        for name in ("agg", "ev"):
            store.alter_table(name, [AddColumns((pa.field("extra", pa.string()),))])
    if mode == "reopen":
        store.close()
        store = Store(data_dir, fsync=False)
        say("reopened", **state(store), **write(store, 2, 100))
    limit(resource.RLIM_INFINITY)
    say("retried", **write(store, 1, 10))
    say("next", **write(store, 2, 100), **state(store))
    store.close()


if __name__ == "__main__":
    main()
