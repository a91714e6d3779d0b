"""Child process of the exactly-once test: a streaming job writing raw events into an aggregation table.

Usage: python -m tests.kv.agg_writer DATA_DIR CHECKPOINT_SEQUENCE CHECKPOINT_POSITION RUN_SEED
On start it undoes its writes after the checkpoint (``Table.undo``), then replays the event stream
from the checkpoint position in batches of random size (the cut depends on RUN_SEED, so the same
sequence number carries other events than in the run that crashed), and prints
``checkpoint <sequence> <position>`` every CHECKPOINT_EVERY batches and ``done`` at the end.
"""

from __future__ import annotations

import random
import sys

import pyarrow as pa

from flightstore.store import Store

WRITER = "job"
TOTAL_EVENTS = 4_000
CHECKPOINT_EVERY = 5
KEYS = 11
SCHEMA = pa.schema([("user", pa.int64()), ("total", pa.int64()), ("top", pa.int64()),
                    ("events", pa.int64()), ("ids", pa.string())])
OPTIONS = {"table.merge-engine": "aggregation", "bucket.num": 3, "fields.total.agg": "sum",
           "fields.top.agg": "max", "fields.events.agg": "sum", "fields.ids.agg": "listagg",
           "fields.ids.listagg.delimiter": " "}


def event(i: int) -> dict:
    """Event ``i`` of the stream: a user, an amount, an id."""
    return {"user": (i * 7919) % KEYS, "total": (i * 37) % 101, "top": (i * 37) % 101, "events": 1,
            "ids": str(i)}


def main() -> None:
    data_dir, checkpoint, position, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    with Store(data_dir) as store:
        table = store.create_table("default.stats", SCHEMA, primary_key=["user"], options=OPTIONS,
                                   if_not_exists=True)
        print("ready", flush=True)
        table.undo(WRITER, checkpoint)
        sequence = checkpoint + 1
        while position < TOTAL_EVENTS:
            end = min(TOTAL_EVENTS, position + rng.randint(1, 40))
            rows = pa.Table.from_pylist([event(i) for i in range(position, end)], schema=SCHEMA)
            table.upsert(rows, writer_id=WRITER, sequence=sequence)
            position = end
            if sequence % CHECKPOINT_EVERY == 0 or position == TOTAL_EVENTS:
                print(f"checkpoint {sequence} {position}", flush=True)
            sequence += 1
        print("done", flush=True)


if __name__ == "__main__":
    main()
