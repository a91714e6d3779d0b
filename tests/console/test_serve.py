"""`flightstore serve --console-port` serves the console (open: the server has no users) and stops
with the server; an ill-typed console.port refuses to start."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request

import flightstore


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_console_port(tmp_path):
    port, console_port = _free_port(), _free_port()
    process = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                                "--port", str(port), "--console-port", str(console_port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert f"grpc://127.0.0.1:{port}" in process.stdout.readline()
        assert f"console at http://127.0.0.1:{console_port}/" in process.stdout.readline()
        with flightstore.connect(f"grpc://127.0.0.1:{port}") as conn:
            conn.sql("CREATE TABLE t (a BIGINT) WITH ('bucket.num' = '4')")
        with urllib.request.urlopen(f"http://127.0.0.1:{console_port}/api/tables", timeout=30) as answer:
            (database,) = json.loads(answer.read())["databases"]
        assert [(t["name"], t["buckets"]) for t in database["tables"]] == [("t", 4)]
        with urllib.request.urlopen(f"http://127.0.0.1:{console_port}/", timeout=30) as answer:
            assert b"/static/console.js" in answer.read()  # the page, shipped in the package
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_a_bad_console_port_refuses_to_start(tmp_path):
    out = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                          "--port", str(_free_port()), "--console-port", "http"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "console.port" in out.stderr
