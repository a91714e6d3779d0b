"""What a GIL hand-off costs a lookup server under the lookup benchmark's load (issue 23's
single-key row): the canned lookup server (:mod:`bench.canned_lookups`) as it is, with N
microseconds of Python holding the GIL per answer, and with N one-element pyarrow calls per
answer (each releases the GIL and takes it back), under :data:`bench.bench_lookups.CLIENTS`
client processes of single-key lookups. A diagnostic, not a benchmark with a peer: it prints
lookups/s and server CPU per lookup of each variant. The two kinds of work cost the same CPU
alone; what the second costs beyond the first under load is the hand-offs.

    python -m bench.gil_handoffs
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.bench_lookups import ROWS, _load
from bench.bench_server import _mixed, _start_server, _stop_server
from flightstore.store import Store

# the same CPU per answer alone (7 calls of pc.add on one element: ~21 us each on this machine)
VARIANTS = (("as it is", []), ("150 us of Python per answer", ["python", "150"]),
            ("7 pyarrow calls (~150 us alone) per answer", ["arrow", "7"]))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-gil-"))
    try:
        rows = _mixed(ROWS, seed=3)
        with Store(root / "data") as store:
            store.create_table("kv", rows.schema, primary_key=["id"], options={"bucket.num": 4}).upsert(
                rows.slice(0, 1))
        for name, extra in VARIANTS:
            process, uri = _start_server(["-m", "bench.canned_lookups", str(root / "data"), *extra], "canned")
            try:
                rate, _, server_ms, client_ms = _load("floor", uri, process.pid)
            finally:
                _stop_server(process)
            print(f"canned lookup server, {name}: {rate:,.0f} lookups/s, server CPU {server_ms:.3f} ms "
                  f"per lookup, clients {client_ms:.3f} ms", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
