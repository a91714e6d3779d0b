"""``flightstore serve`` in a process forked from a multiprocessing fork server that imported
flightstore once, for the kill -9 tests that restart their server several times: a fresh
interpreter spends seconds of CPU importing flightstore, pyarrow, DuckDB and pyiceberg at every
start, which is most of such a test's cost on a busy machine. The child runs the real ``serve``
command (:func:`flightstore.cli.main`) in a process of its own: kill -9 kills it and nothing else.
A forked child has the environment and working directory the fork server started with (the first
fork of the pytest process), not a test's later changes to them: pass settings as arguments.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
from pathlib import Path

from tests.waiting import wait_until

# Imported once by the fork server: the server, the lake's tiering and the test helpers whose
# functions the children run (of every test that forks: a pytest process has one fork server,
# started with the preload list set first, so every test sets this one through fork_context).
PRELOAD = ["flightstore.cli", "flightstore.client", "flightstore.server.service", "flightstore.store",
           "flightstore.lake.tierer", "tests.forked_server", "tests.lake.tier_child", "tests.kv.crash_writer",
           "tests.kv.agg_writer"]


def fork_context() -> multiprocessing.context.ForkServerContext:
    """The multiprocessing context whose processes fork from the preloaded fork server."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _serve(args: list[str], log: str) -> None:
    from flightstore import cli
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    cli.main(["serve", *args])


class ForkedServer:
    """``flightstore serve --data-dir DATA_DIR --port 0 *args``, its output appended to ``log``
    (default: ``server.log`` beside the data directory); returns once it printed the address it
    serves at (:attr:`uri`)."""

    def __init__(self, data_dir: Path, *args: str, log: Path | None = None, start_timeout: float = 180) -> None:
        self.log = log or Path(data_dir).parent / "server.log"
        start = self.log.stat().st_size if self.log.exists() else 0  # a restart appends to the same log
        self.process = fork_context().Process(target=_serve, daemon=True, args=(
            ["--data-dir", str(data_dir), "--port", "0", *args], str(self.log)))
        self.process.start()
        found: list[str] = []

        def serving() -> bool:
            if self.log.exists():
                with open(self.log, "rb") as out:
                    out.seek(start)
                    found.extend(re.findall(r"serving .* at (grpc\S*://\S+)\n", out.read().decode(errors="replace")))
            return bool(found) or not self.process.is_alive()

        wait_until(serving, "the server's 'serving' line", timeout=start_timeout, poll=0.05)
        assert found, f"the server did not start: {self.log.read_text(errors='replace')[-3000:]}"
        self.uri = found[0]

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(timeout=60)

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(timeout=120)
        assert self.process.exitcode is not None, "the server did not stop on SIGTERM"
