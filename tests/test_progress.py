"""Progress on a terminal, silence in a pipe (flightstore/progress.py): `flightstore verify` and
`flightstore sql` run as real processes, once with stdout and stderr on a pseudo-terminal (a bar
with the step counts appears, then the command's own output), once piped (byte for byte the
output without progress, nothing on stderr)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyarrow as pa

from flightstore.store import Store

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(ROOT), COLUMNS="120")


def _on_a_terminal(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run ``python -m flightstore ARGS`` with stdout and stderr on one pty; its exit status and
    everything it wrote (escape codes included)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "flightstore", *args], stdin=subprocess.DEVNULL,
                               stdout=child, stderr=child, env=ENV, cwd=ROOT)
    os.close(child)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the child closed its side (it exited)
                break
            if not data:
                break
            out += data
        return process.wait(timeout=max(1.0, deadline - time.monotonic())), out.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)


def _piped(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightstore", *args], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=120)


def _data_dir(tmp_path: Path) -> Path:
    with Store(tmp_path / "data", fsync=False) as store:
        store.create_table("t", pa.schema([("a", pa.int64())]), options={"bucket.num": "4"})
        store.table("t").append(pa.table({"a": list(range(100))}))
    return tmp_path / "data"


def test_verify_shows_its_buckets_on_a_terminal_and_nothing_in_a_pipe(tmp_path) -> None:
    data = _data_dir(tmp_path)
    piped = _piped(["verify", str(data)])
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""
    assert piped.stdout == "flightstore verify: 0 error(s), 0 warning(s), 0 note(s)\n"
    status, shown = _on_a_terminal(["verify", str(data)])
    assert status == 0, shown
    assert "0/4 buckets" in shown and "\x1b[" in shown  # the bar, with the bucket count
    assert shown.replace("\r\n", "\n").endswith(piped.stdout)  # then the report, as in the pipe


def test_sql_shows_rows_arriving_on_a_terminal_and_nothing_in_a_pipe(server) -> None:
    server.store.create_table("big", pa.schema([("a", pa.int64())]), options={"bucket.num": "2"})
    server.store.table("big").append(pa.table({"a": list(range(50_000))}))
    statement = "SELECT a FROM big ORDER BY a"
    piped = _piped(["sql", "--uri", server.uri, statement])
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "" and "\x1b" not in piped.stdout
    lines = piped.stdout.splitlines()
    assert lines[:3] == ["  a", "---", "  0"] and lines[-1] == "(50000 rows, 200 shown)"
    status, shown = _on_a_terminal(["sql", "--uri", server.uri, statement])
    assert status == 0, shown
    assert f"{statement}" in shown and " rows" in shown and "\x1b[" in shown  # the bar
    assert shown.replace("\r\n", "\n").endswith(piped.stdout)  # then the same table
