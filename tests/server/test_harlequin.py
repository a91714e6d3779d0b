"""Harlequin (terminal SQL IDE) with its ADBC adapter against a real flightstore server, under tmux.

Harlequin, harlequin-adbc and adbc-driver-flightsql live in their own cached virtualenv (see
``client_venv``). harlequin-adbc 0.1.2 calls ``duckdb.sql(...).arrow().to_pylist()``, which only
works with duckdb < 1.4 (later versions return a RecordBatchReader), hence the pin. tmux is
installed with apt-get when missing (CI runs as root).

The test drives the UI like a person: it waits for the catalog pane, expands database -> schema ->
table, types a join in the editor and runs it, and checks the screen. Set
``FLIGHTSTORE_HARLEQUIN_CAPTURE=path`` to save the final screen (docs/harlequin.txt was made so).

Known harlequin-adbc quirk, not a server bug: the catalog's column type labels ("?", "#.#") come
from harlequin-adbc looking up the XDBC type code (BIGINT = -5, VARCHAR = 12) in a table keyed by
Arrow type ids; the query results pane, which uses Arrow types, labels them correctly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid

import pytest

import flightstore
from tests.server.test_flightsql_dbapi import client_venv
from tests.system_packages import ensure

HARLEQUIN_REQUIREMENTS = ["harlequin==2.17.0", "harlequin-adbc==0.1.2", "adbc-driver-flightsql",
                          "duckdb<1.4"]


def _tmux() -> str:
    ensure("tmux")
    return shutil.which("tmux")


@pytest.fixture(scope="session")
def harlequin_bin():
    python = client_venv("harlequin", HARLEQUIN_REQUIREMENTS)
    return python.parent / "harlequin"


FOCUSED_CORNER = "\x1b[38;5;229m╰"


class Screen:
    def __init__(self, tmux: str, socket: str) -> None:
        self.base = [tmux, "-L", socket]

    def capture(self, escapes: bool = False) -> str:
        return subprocess.run([*self.base, "capture-pane", "-p", *(["-e"] if escapes else []), "-t", "hq"],
                              capture_output=True,
                              text=True, timeout=30).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        """Type ``keys``; the app reads its terminal input in order, so the next wait_for is the
        only synchronisation needed."""
        subprocess.run([*self.base, "send-keys", "-t", "hq", *(["-l"] if literal else []), *keys],
                       check=True, timeout=30)

    def catalog_focused(self) -> bool:
        """Whether the data catalog pane has the focus: harlequin draws the focused pane's border in
        colour 229, and the catalog's bottom-left corner starts the screen's last border line."""
        return any(line.startswith(FOCUSED_CORNER) for line in self.capture(escapes=True).splitlines())

    def wait_focus(self, catalog: bool, timeout: float = 120) -> None:
        """Wait until the focus is (or is not) on the catalog: a key sent before a focus change
        took effect goes to the previously focused widget (an Enter becomes a newline)."""
        deadline = time.monotonic() + timeout
        while self.catalog_focused() != catalog:
            if time.monotonic() > deadline:
                raise AssertionError(f"the catalog never {'got' if catalog else 'lost'} the focus:\n"
                                     f"{self.capture()}")
            time.sleep(0.1)  # poll interval of the condition above

    def wait_for(self, *texts: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if all(t in screen for t in texts):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{texts} never appeared; the screen was:\n{screen}")
            time.sleep(0.25)  # poll interval of the condition above


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run builds harlequin's virtualenv (pip) inside this budget
def test_harlequin_catalog_and_query(server, harlequin_bin, tmp_path):
    tmux = _tmux()
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE users (id BIGINT, name STRING, city STRING, PRIMARY KEY (id) NOT ENFORCED)")
        conn.sql("CREATE TABLE orders (order_id BIGINT, user_id BIGINT, amount DOUBLE, status STRING)")
        conn.execute("INSERT INTO users VALUES (1, 'ann', 'paris'), (2, 'bob', 'oslo'), (3, 'cid', 'paris')")
        conn.execute("INSERT INTO orders VALUES (10, 1, 5.5, 'paid'), (11, 2, 7.0, 'new'), "
                     "(12, 1, 2.5, 'paid'), (13, 3, 1.0, 'done')")

    socket = f"flightstore-test-{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_DATA_HOME": str(home / ".local"), "TERM": "xterm-256color", "LANG": "C.UTF-8",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    command = f"{harlequin_bin} --locale C -a adbc --driver-type flightsql {server.uri}; sleep 600"
    subprocess.run([tmux, "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "hq", "-x", "160",
                    "-y", "45", command], check=True, env=env, timeout=30)
    screen = Screen(tmux, socket)
    try:
        screen.wait_for("Data Catalog", "flightstore db", timeout=240)
        screen.keys("F6")           # focus the data catalog
        screen.wait_focus(catalog=True)
        screen.keys("Enter")        # expand the catalog "flightstore"
        screen.wait_for("default s")
        screen.keys("Down")
        screen.keys("Enter")        # expand the schema "default"
        screen.wait_for("orders t", "users t")
        screen.keys("Down")
        screen.keys("Down")
        screen.keys("Enter")        # expand the table "users"
        catalog = screen.wait_for("city")
        for column in ("id", "name", "city"):
            assert f"─ {column} " in catalog
        screen.keys("F2")           # focus the query editor
        screen.wait_focus(catalog=False)
        screen.keys("SELECT u.name, SUM(o.amount) AS total FROM orders o JOIN users u "
                    "ON o.user_id = u.id GROUP BY u.name ORDER BY u.name", literal=True)
        screen.keys("C-j")          # run the query
        result = screen.wait_for("Query Results (3 Records)", "1 query executed successfully")
        for name, total in (("ann", 8), ("bob", 7), ("cid", 1)):
            assert re.search(rf"│ {name}\s+{total}\s", result), result
        target = os.environ.get("FLIGHTSTORE_HARLEQUIN_CAPTURE")
        if target:
            with open(target, "w") as handle:
                handle.write("\n".join(line.rstrip() for line in result.splitlines()).rstrip() + "\n")
    finally:
        subprocess.run([tmux, "-L", socket, "kill-server"], capture_output=True, timeout=10)
