"""The cached virtualenvs of the clients that cannot share ours (Superset, harlequin,
flightsql-dbapi, DuckDB's iceberg reader): built by ``make test`` before the suite
(``python -m tests.client_venvs NAME...``), or in the background while a suite started otherwise runs.

They are installs, kept in the venv for every later run: Superset's alone is ~160 s of pip, then
its site template (:func:`flightstore_sqlalchemy.superset_launch.site_template`); built
during the suite, they took the two cores from the tests. When a suite starts without them
(pytest run directly),
``tests/conftest.py`` starts ``python -m tests.client_venvs NAME...`` once the collection is
known, for the venvs the collected tests need, in the order the suite needs them; the tests call
the same :func:`flightstore_sqlalchemy.superset_launch.cached_venv` (and ``site_template``), which
waits (a file lock) for a build in progress and returns a finished one at once. A background build that fails
or is cut short leaves no finished venv: the test builds it again and reports the failure itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["BUILD_ORDER", "USERS", "build", "needed", "start_building", "stop_building"]

ROOT = Path(__file__).resolve().parents[1]

# The test files that need a client venv, by venv name. A file missing here still works: its
# test builds the venv itself, in its own time.
USERS = {
    "tests/server/test_flightsql_dbapi.py": "flightsql-dbapi",
    "tests/cluster/test_data_path.py": "flightsql-dbapi",
    "tests/sqlalchemy_dialect/test_superset.py": "superset",
    "tests/server/test_harlequin.py": "harlequin",
    "tests/lake/test_read.py": "duckdb-iceberg",
}
# Built one after the other (the test workers have the two cores), the earliest needed first:
# test_data_path runs among the first files (tests/conftest.py LONGEST_FIRST), Superset a little later.
BUILD_ORDER = ["flightsql-dbapi", "superset", "harlequin", "duckdb-iceberg"]


def needed(nodeids: Iterable[str]) -> list[str]:
    """The venvs the tests ``nodeids`` use, in :data:`BUILD_ORDER`."""
    names = {USERS.get(nodeid.split("::", 1)[0]) for nodeid in nodeids}
    return [name for name in BUILD_ORDER if name in names]


def build(name: str) -> Path:
    """Build (or find) the venv ``name`` exactly as its tests do; its python."""
    from flightstore_sqlalchemy.superset_launch import cached_venv, site_template, superset_python
    if name == "superset":  # and the site its test copies (db upgrade, init: minutes of its time)
        python = superset_python()
        site_template(python)
        return python
    if name == "flightsql-dbapi":
        from tests.server.test_flightsql_dbapi import CLIENT_REQUIREMENTS
        return cached_venv(name, CLIENT_REQUIREMENTS)
    if name == "harlequin":
        from tests.server.test_harlequin import HARLEQUIN_REQUIREMENTS
        return cached_venv(name, HARLEQUIN_REQUIREMENTS)
    if name == "duckdb-iceberg":
        from tests.lake.test_read import DUCKDB_REQUIREMENTS
        return cached_venv(name, DUCKDB_REQUIREMENTS)
    raise ValueError(f"no client venv named {name!r}; known: {BUILD_ORDER}")


def start_building(names: list[str]) -> subprocess.Popen | None:
    """``python -m tests.client_venvs names...`` in its own process group (pip's children are
    stopped with it); None when there is nothing to build."""
    if not names:
        return None
    return subprocess.Popen([sys.executable, "-m", "tests.client_venvs", *names], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop_building(process: subprocess.Popen | None) -> None:
    """At the end of the session: a build still running (its tests were deselected or the run
    stopped early) is stopped; the venv it leaves unfinished is built again when next needed."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def main(names: list[str]) -> int:
    """Build the venvs ``names`` (none: all of :data:`BUILD_ORDER`, as ``make test`` does before
    the suite), saying which and how long each took (a finished one: at once); 1 if any failed,
    after trying every one."""
    failed = 0
    for name in names or BUILD_ORDER:
        print(f"client venv {name}: building or checking (the first time takes minutes) ...", flush=True)
        began = time.monotonic()
        try:
            python = build(name)
        except Exception as exc:  # noqa: BLE001 - the next venv is still worth building
            print(f"building the {name} venv failed: {exc}", file=sys.stderr, flush=True)
            failed += 1
            continue
        print(f"client venv {name}: ready in {time.monotonic() - began:.0f} s ({python})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
