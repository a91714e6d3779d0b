"""Where the batched lookuper's CPU goes (issue 23's batched row): the lookup benchmark's batched
load (:data:`bench.bench_lookups.CLIENTS` client processes, :data:`~bench.bench_lookups.IN_FLIGHT`
keys in flight each, :data:`~bench.bench_lookups.LOOKUPER_OPTIONS`) against one server and against
``serve --workers 2``. A diagnostic, not a benchmark with a peer: it prints keys/s and the CPU per
key of the server(s) and of the clients. On this 2-core machine the clients and the server share
the cores, so a key's client CPU counts as much as its server CPU; the machine is shared, so
compare CPU per key of runs made one after the other, not keys/s.

With ``--workers`` the servers' CPU is counted from before the client processes start to after
they end (their warm-up included), per key answered in the measured window (keys/s times
:data:`~bench.bench_lookups.SECONDS`). To see where it goes, record the server while it runs:
``py-spy record -p <pid> --nonblocking -r 250 --format raw -o server.txt``.

    python -m bench.lookuper_cpu [--rounds N] [--workers]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_lookup_cpu import _cpu_s
from bench.bench_lookups import ROWS, SECONDS, _load, _start_workers
from bench.bench_server import _mixed, _start_server, _stop_server
from flightstore.store import Store


def _one_server(root: Path) -> str:
    rows = _mixed(ROWS, seed=3)
    with Store(root / "data") as store:
        store.create_table("kv", rows.schema, primary_key=["id"], options={"bucket.num": 4}).upsert(rows)
    process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"), "--host",
                                  "127.0.0.1", "--port", "0", "--no-fsync"], "flightstore serving")
    try:
        rate, _, server_ms, client_ms = _load("batched", uri, process.pid)
    finally:
        _stop_server(process)
    return f"one server: {rate:,.0f} keys/s, CPU per key: server {server_ms:.4f} ms, clients {client_ms:.4f} ms"


def _workers(root: Path) -> str:
    process, uri = _start_workers(root / "data-workers", _mixed(ROWS, seed=3))
    try:
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        pids = [process.pid, *map(int, children)]
        before = sum(_cpu_s(pid) for pid in pids)
        started = time.monotonic()
        rate, _, _, client_ms = _load("batched", uri, None)
        keys = rate * SECONDS
        servers_ms = (sum(_cpu_s(pid) for pid in pids) - before) / keys * 1e3
    finally:
        _stop_server(process)
    return (f"serve --workers 2 ({len(pids)} processes): {rate:,.0f} keys/s, CPU per key: servers {servers_ms:.4f} ms "
            f"(over {time.monotonic() - started:.0f} s), clients {client_ms:.4f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", action="store_true", help="also against serve --workers 2")
    args = parser.parse_args()
    for _ in range(args.rounds):
        root = Path(tempfile.mkdtemp(prefix="bench-lookuper-cpu-"))
        try:
            print(_one_server(root), flush=True)
            if args.workers:
                print(_workers(root), flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
