"""Child process of the ALTER crash test: writes, ALTERs and partition DDL in a loop, printing what
was acknowledged.

Usage: python -m tests.alter_crash_writer DATA_DIR FIRST_STEP
Step ``s`` writes, under writer id "crash" and sequence ``s``, one row per key 0..ROWS-1 into three
partitions of a primary-key table and of a log table, with ``v = s`` and every added column
``c<j>`` = s; then prints ``ack <s> <number of added columns written>``. Every third step first adds
a column (``alter <n>`` once acknowledged); every fourth drops one empty partition and adds another.
Before each write it prints ``try <s> <added columns>``: a step an earlier, killed run wrote without
acknowledging it is a duplicate (same writer sequence) when tried again, and keeps that try's columns.
"""

from __future__ import annotations

import sys

import pyarrow as pa

from flightstore.alter import AddColumns, AddPartition, DropPartition
from flightstore.store import Store

SCHEMA = pa.schema([("dt", pa.string()), ("k", pa.int64()), ("v", pa.int64())])
ROWS = 6
DAYS = ("d0", "d1", "d2", "d3", "d4")


def partitions_of(step: int) -> list[str]:
    return [DAYS[(step + i) % len(DAYS)] for i in range(3)]


def rows(step: int, added: int) -> pa.Table:
    days = partitions_of(step)
    data = {"dt": [d for d in days for _ in range(ROWS)], "k": [k for _ in days for k in range(ROWS)],
            "v": [step] * (ROWS * len(days))}
    for j in range(1, added + 1):
        data[f"c{j}"] = pa.array([step] * (ROWS * len(days)), pa.int64())
    return pa.table(data)


def main() -> None:
    data_dir, first = sys.argv[1], int(sys.argv[2])
    with Store(data_dir, fsync=False) as store:
        pk = store.create_table("default.pk", SCHEMA, primary_key=["dt", "k"], partition_keys=["dt"],
                                options={"bucket.num": 2}, if_not_exists=True)
        log = store.create_table("default.lg", SCHEMA, partition_keys=["dt"],
                                 options={"bucket.num": 2, "bucket.key": "k"}, if_not_exists=True)
        # A crash between the two tables' ALTERs leaves lg a column behind pk: catch it up first.
        while len(log.schema) < len(pk.schema):
            store.alter_table("default.lg", [AddColumns((pa.field(f"c{len(log.schema) - 2}", pa.int64()),))])
        print("ready", flush=True)
        step = first
        while True:
            added = len(pk.schema) - len(SCHEMA)
            if step % 3 == 0:
                for name in ("default.pk", "default.lg"):
                    store.alter_table(name, [AddColumns((pa.field(f"c{added + 1}", pa.int64()),))])
                added += 1
                print(f"alter {added}", flush=True)
            if step % 4 == 0:
                for name in ("default.pk", "default.lg"):
                    store.alter_table(name, [DropPartition((f"e{step - 4}",), if_exists=True),
                                             AddPartition((f"e{step}",), if_not_exists=True)])
            batch = rows(step, added)
            print(f"try {step} {added}", flush=True)
            pk.upsert(batch, writer_id="crash", sequence=step)
            log.append(batch, writer_id="crash", sequence=step)
            print(f"ack {step} {added}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
