"""`flightstore serve` as a real process: it serves, SIGTERM shuts it down cleanly, and a second
server on the same data directory refuses to start."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

import flightstore
from flightstore.cli import main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_answers_and_stops_on_sigterm(tmp_path):
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir",
                                str(tmp_path / "data"), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert f"grpc://127.0.0.1:{port}" in line
        with flightstore.connect(f"grpc://127.0.0.1:{port}") as conn:
            conn.sql("CREATE TABLE t (a BIGINT)")
            conn.sql("INSERT INTO t VALUES (1), (2)")
            assert conn.sql("SELECT COUNT(*) AS n FROM t").to_pylist() == [{"n": 2}]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert "stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
    # The data survived the restart of the process.
    with flightstore.Store(tmp_path / "data") as store:
        assert store.table("t").row_count() == 2


def test_a_second_server_on_the_same_data_dir_refuses_to_start(tmp_path):
    first = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir",
                              str(tmp_path / "data"), "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "flightstore serving" in first.stdout.readline()
        second = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--data-dir",
                                 str(tmp_path / "data"), "--port", "0"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert f"already open in another flightstore Store (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first server is untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)


def test_options_command_prints_the_registry():
    out = subprocess.run([sys.executable, "-m", "flightstore", "options"], capture_output=True, text=True,
                         check=True).stdout
    assert "`table.merge-engine`" in out and "`bucket.num`" in out


def test_sql_command_prints_tables_and_exits_1_with_the_message(server):
    def sql(*statements: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flightstore", "sql", "--uri", server.uri, *statements],
                              capture_output=True, text=True, timeout=60)

    done = sql("CREATE TABLE t (id BIGINT, name STRING, amount DECIMAL(10, 2))",
               "INSERT INTO t VALUES (1, 'ann', 1.5), (20, NULL, 300.25)", "SELECT * FROM t ORDER BY id")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-5:] == [
        "id | name | amount",
        "---+------+-------",
        " 1 | ann  |   1.50",
        "20 | NULL | 300.25",
        "(2 rows)",
    ]
    assert "pyarrow.Table" not in done.stdout
    bad = sql("SELECT nope FROM t", "SELECT 1")
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert bad.stderr.strip().startswith("flightstore sql: ")
    assert "unknown column 'nope'" in bad.stderr and "columns are id, name, amount" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    down = subprocess.run([sys.executable, "-m", "flightstore", "sql", "--uri", f"grpc://127.0.0.1:{_free_port()}",
                           "SELECT 1"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert down.stderr.startswith("flightstore sql: ")


@pytest.mark.parametrize("command", [[], ["serve"], ["cluster"], ["cluster", "status"], ["cluster", "decommission"],
                                     ["sql"], ["snapshot"], ["lake"], ["lake", "status"], ["user"], ["verify"],
                                     ["repair"], ["options"]])
def test_every_command_prints_its_help(command, capsys):
    """Option docs become help texts, and argparse expands ``%`` in them (``b % N`` crashed --help)."""
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: flightstore" in capsys.readouterr().out
