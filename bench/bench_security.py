"""What security costs: primary-key point lookups over TLS with authentication vs plaintext without.

Two servers of the same build, each in its own process, serve copies of the same 100k-row
primary-key table: one plain (``grpc://``, no users), one with ``--tls-cert/--tls-key`` and
``--users-file`` (every call carries a bearer token the middleware checks, and the authorizer checks
the caller's grants; the user is a super user, the check still runs). The same clients measure both,
in interleaved rounds: flightstore's Python client (one DoGet per lookup) and ADBC
(``SELECT * FROM t WHERE id = ?``: prepare, GetFlightInfo, DoGet). Goal: TLS + auth >= 0.8x of
plaintext (p50 latency, so the ratio reads plaintext / secured).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.bench_server import LOOKUP_ROWS, _dbapi_lookup, _latencies, _mixed, _stop_server
from bench.report import Row
from flightstore.store import Store

LOOKUPS = 2_000
ROUNDS = 4
USER, PASSWORD = "bench", "bench-pässword"
HERE = Path(__file__).parent


def _start(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=HERE.parent, env=env)
    line = process.stdout.readline()
    if not line.startswith("flightstore serving") or " at grpc" not in line:
        process.kill()
        raise RuntimeError(f"flightstore serve {args} did not start: {line!r}")
    return process, line.split(" at ", 1)[1].strip()


def _certificates(root: Path):
    sys.path.insert(0, str(HERE.parent))
    from tests.certs import make_certificates  # the test suite's certificate maker (cryptography)
    return make_certificates(root / "certs")


def run() -> list[Row]:
    import adbc_driver_flightsql as adbc_flightsql
    import adbc_driver_flightsql.dbapi as flightsql

    import flightstore

    root = Path(tempfile.mkdtemp(prefix="bench-security-"))
    try:
        table = _mixed(LOOKUP_ROWS, seed=3)
        for name in ("plain", "secure"):
            with Store(root / name) as store:
                store.create_table("lookup_t", table.schema, primary_key=["id"]).upsert(table)
        certs = _certificates(root)
        users_file = root / "users.json"
        subprocess.run([sys.executable, "-m", "flightstore", "user", "add", USER, "--users-file", str(users_file)],
                       env={**os.environ, "FLIGHTSTORE_PASSWORD": PASSWORD}, check=True, timeout=120,
                       capture_output=True, cwd=HERE.parent)
        keys = np.random.default_rng(7).integers(0, LOOKUP_ROWS, LOOKUPS)
        with ExitStack() as stack:
            plain, plain_uri = _start(["--data-dir", str(root / "plain"), "--port", "0"])
            stack.callback(_stop_server, plain)
            secure, secure_uri = _start(["--data-dir", str(root / "secure"), "--port", "0",
                                         "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                                         "--users-file", str(users_file), "--super-user", USER])
            stack.callback(_stop_server, secure)
            assert secure_uri.startswith("grpc+tls://")

            def adbc(uri: str, **kwargs: str):
                conn = stack.enter_context(flightsql.connect(uri, db_kwargs=kwargs or None, autocommit=True))
                return stack.enter_context(conn.cursor())

            tls_adbc = {adbc_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value: certs.ca.read_text(),
                        "username": USER, "password": PASSWORD}
            native_plain = stack.enter_context(flightstore.connect(plain_uri)).table("lookup_t")
            native_secure = stack.enter_context(flightstore.connect(
                secure_uri, username=USER, password=PASSWORD, tls_root_certs=certs.ca)).table("lookup_t")
            sql = "SELECT * FROM lookup_t WHERE id = ?"
            runs = {
                "client plain": lambda key: native_plain.lookup({"id": [key]}).num_rows,
                "client secure": lambda key: native_secure.lookup({"id": [key]}).num_rows,
                "adbc plain": _dbapi_lookup(adbc(plain_uri), sql),
                "adbc secure": _dbapi_lookup(adbc(secure_uri, **tls_adbc), sql),
            }
            for lookup in runs.values():
                lookup(int(keys[0]))  # warm up: connection, prepare, plan
            latency: dict[str, list[np.ndarray]] = {name: [] for name in runs}
            for chunk in np.array_split(keys, ROUNDS):
                for name, lookup in runs.items():
                    latency[name].append(_latencies(lookup, chunk)[0])
        p50 = {name: float(np.percentile(np.concatenate(t), 50)) for name, t in latency.items()}
        p99 = {name: float(np.percentile(np.concatenate(t), 99)) for name, t in latency.items()}
        peer = "same build, plaintext grpc://, no authentication"
        return [
            Row("PK lookup p50 over TLS + auth, flightstore client", p50["client secure"], p50["client plain"],
                "ms", peer, higher_is_better=False, goal=">=0.8x"),
            Row("PK lookup p99 over TLS + auth, flightstore client", p99["client secure"], p99["client plain"],
                "ms", peer, higher_is_better=False),
            Row("PK lookup p50 over TLS + auth, ADBC WHERE id = ?", p50["adbc secure"], p50["adbc plain"],
                "ms", peer, higher_is_better=False, goal=">=0.8x"),
            Row("PK lookup p99 over TLS + auth, ADBC", p99["adbc secure"], p99["adbc plain"], "ms", peer,
                higher_is_better=False),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
