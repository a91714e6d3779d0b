"""One writer process of ``bench_durability``: small writes through the server on command.

``python -m bench.durability_writer NUMBER URI...`` connects to every server, writes one batch to
each (the writer id and sequence lookup are not part of the measure), prints ``ready``, then serves
commands read from stdin: ``go SERVER OP COUNT`` writes COUNT batches of 10 rows (OP: ``append`` to
table ``lg``, ``upsert`` to table ``pk``) to server number SERVER and prints ``done``; ``quit``
exits. Keys of upserts are the writer's own (no two writers touch one key).
"""

from __future__ import annotations

import sys

import pyarrow as pa

import flightstore

ROWS = 10


def main() -> None:
    number, uris = int(sys.argv[1]), sys.argv[2:]
    connections = [flightstore.connect(uri) for uri in uris]
    tables = [{"append": c.table("lg", writer_id=f"w{number}-lg"),
               "upsert": c.table("pk", writer_id=f"w{number}-pk")} for c in connections]
    written = 0

    def batch() -> pa.Table:
        nonlocal written
        ids = [number * 10_000_000 + (written * ROWS + i) % 100_000 for i in range(ROWS)]
        written += 1
        return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"value {i}" for i in ids]})

    for server in tables:
        server["append"].append(batch())
        server["upsert"].upsert(batch())
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "quit":
            break
        server, op, count = int(words[1]), words[2], int(words[3])
        write = getattr(tables[server][op], op)
        for _ in range(count):
            write(batch())
        print("done", flush=True)
    for connection in connections:
        connection.close()


if __name__ == "__main__":
    main()
