"""``flightstore serve`` in a process forked from a multiprocessing fork server that imported
flightstore once, for the tests that start many servers (the cluster tests, the kill -9 tests that
restart their server several times): a fresh interpreter spends 3-5 s of CPU importing
flightstore, pyarrow, DuckDB, pyiceberg and kazoo at every start, a fork ~0.2 s, and on CI's
2-core machine the suite is CPU-bound.

The child runs the real ``serve`` command (:func:`flightstore.cli.main`) in a process of its own:
kill -9 and SIGSTOP reach it and nothing else (the fork server and the other servers are other
processes). The fork server only imports: no socket or file of the test's process reaches a
child, and no Python thread runs in it (pyarrow's import starts two native threads, jemalloc's
background thread among them, which a fork does not copy; the kill -9 tests have forked this way
since they were written). It was started with the environment and working directory of the first
fork of the pytest process: a child takes the starting test's environment and working directory
at each start, as a subprocess would. ``flightstore.cluster.local.ServerProcess`` (a fresh
``python -m flightstore serve``) stays the product's way, which tests/cluster/test_cli.py covers.
The kill -9 tests' writer processes (``python -m tests.kv.crash_writer`` ...) fork the same way
(:class:`ForkedModule`): a test that kills its writer 12 times paid 12 interpreter starts.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Sequence

from flightstore.errors import FlightstoreError
from tests.waiting import wait_until

# Imported once by the fork server: the server, a cluster member's modules, the lake's tiering and
# the test helpers whose functions the children run (of every test that forks: a pytest process has
# one fork server, started with the preload list set first, so every test sets this one through
# fork_context). Importing them starts no Python thread.
PRELOAD = ["flightstore.cli", "flightstore.client", "flightstore.server.service", "flightstore.store",
           "flightstore.cluster.member", "flightstore.cluster.store", "flightstore.cluster.workers.launch",
           "flightstore.console", "flightstore.lake.tierer", "tests.forked_server", "tests.lake.tier_child",
           "tests.kv.crash_writer", "tests.kv.agg_writer", "tests.alter_crash_writer"]


def fork_context() -> multiprocessing.context.ForkServerContext:
    """The multiprocessing context whose processes fork from the preloaded fork server."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _serve(args: list[str], log: str, environ: dict[str, str], cwd: str) -> None:
    """In the forked child: the starting test's environment and directory, output and errors
    appended to ``log``, then the ``serve`` command (which exits the process)."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    from flightstore import cli
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    cli.main(["serve", *args])


class ForkedServerProcess:
    """``flightstore serve *args`` forked from the fork server, with the interface of
    :class:`flightstore.cluster.local.ServerProcess` the tests use (``start`` returns once it
    printed its :attr:`uri`; ``pid``, ``alive``, ``kill``, ``stop``); its output and errors are
    appended to ``log``, so a restart on the same log keeps the earlier runs' lines."""

    def __init__(self, args: Sequence[str], *, log: Path, cwd: Path | None = None) -> None:
        """``cwd``: the server's working directory (default: the test's at start)."""
        self.args = list(args)
        self.log = Path(log)
        self.cwd = cwd
        self.uri: str | None = None
        self.process: multiprocessing.process.BaseProcess | None = None
        self._offset = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def lines(self) -> list[str]:
        """What this run wrote so far (output and errors), line by line."""
        if not self.log.exists():
            return []
        with open(self.log, "rb") as out:
            out.seek(self._offset)
            return out.read().decode(errors="replace").splitlines(keepends=True)

    def start(self, timeout: float = 120.0) -> ForkedServerProcess:
        """Start the process; return once it prints its URI (FlightstoreError if it exits or
        stays silent for ``timeout`` seconds)."""
        self.uri = None
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        self.process = fork_context().Process(target=_serve, daemon=True, args=(
            self.args, str(self.log), dict(os.environ), str(self.cwd or os.getcwd())))
        self.process.start()

        def serving() -> bool:
            for line in self.lines:
                if line.startswith("flightstore serving") and " at " in line and line.endswith("\n"):
                    self.uri = line.rsplit(" at ", 1)[1].strip()
            return self.uri is not None or not self.process.is_alive()

        try:
            wait_until(serving, "the server's 'flightstore serving' line", timeout=timeout, poll=0.05)
        except AssertionError:
            pass
        if self.uri is None:
            code = self.process.exitcode
            self.kill()
            detail = "".join(self.lines)[-3000:]
            raise FlightstoreError(f"flightstore serve {' '.join(self.args)} did not start "
                                   f"(exit code {code}):\n{detail}")
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def exitcode(self) -> int | None:
        """The exit code once it ended (-N: killed by signal N), as Popen.returncode."""
        return self.process.exitcode if self.process is not None else None

    def kill(self) -> None:
        """SIGKILL, as a crash (it works on a SIGSTOPped process too)."""
        if self.alive():
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(30)

    def terminate(self) -> None:
        """SIGTERM, without waiting."""
        if self.alive():
            self.process.terminate()

    def freeze(self, timeout: float = 60.0) -> None:
        """SIGSTOP, returning once every thread of the process is stopped. ``kill`` only queues
        the signal: the kernel stops the other threads when one thread takes it, and on a busy
        machine that thread may wait for a core while the others still answer a request."""
        os.kill(self.process.pid, signal.SIGSTOP)
        wait_until(lambda: all(state == "T" for state in _thread_states(self.process.pid)),
                   "every thread of the server stopped", timeout=timeout, poll=0.005)

    def wait(self, timeout: float) -> int | None:
        """The exit code once it ended; None if it still runs after ``timeout`` seconds."""
        if self.process is None:
            return None
        self.process.join(timeout)
        return self.process.exitcode

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        if self.process is None:
            return None
        self.terminate()
        if self.wait(timeout) is None:
            self.kill()
        return self.process.exitcode


def _thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of ``pid`` (``T``: stopped by a signal)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        states.append(stat[stat.rindex(")") + 2])
    return states


class ForkedServer(ForkedServerProcess):
    """``flightstore serve --data-dir DATA_DIR --port 0 *args``, its output appended to ``log``
    (default: ``server.log`` beside the data directory), started: returns once it printed the
    address it serves at (:attr:`uri`)."""

    def __init__(self, data_dir: Path, *args: str, log: Path | None = None, start_timeout: float = 180) -> None:
        super().__init__(["--data-dir", str(data_dir), "--port", "0", *args],
                         log=log or Path(data_dir).parent / "server.log")
        self.start(start_timeout)

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM and wait; fails if it does not stop within ``timeout`` seconds."""
        self.terminate()
        code = self.wait(timeout)
        assert code is not None, "the server did not stop on SIGTERM"
        return code


def _run_module(module: str, argv: list[str], out: Connection, environ: dict[str, str], cwd: str) -> None:
    """In the forked child: the starting test's environment and directory, standard output on the
    pipe ``out``, then ``module``'s ``main()`` with ``argv`` as ``python -m module argv`` has them."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    os.dup2(out.fileno(), 1)
    out.close()
    sys.argv = [module, *argv]
    importlib.import_module(module).main()


class ForkedModule:
    """``python -m MODULE *ARGS`` (a preloaded test writer whose ``main()`` reads ``sys.argv``),
    forked from the fork server instead of a fresh interpreter's 2-5 s of imports, with the
    interface of :class:`subprocess.Popen` the kill -9 tests use: its standard output as text lines
    in :attr:`stdout` (a pipe, at its end once the process died), ``pid``, ``poll``, ``wait``,
    ``kill``, ``returncode`` (-9 after a SIGKILL)."""

    def __init__(self, module: str, *args: str, cwd: Path | None = None) -> None:
        context = fork_context()
        reader, writer = context.Pipe(duplex=False)
        self.process = context.Process(target=_run_module, daemon=True, args=(
            module, list(args), writer, dict(os.environ), str(cwd or os.getcwd())))
        self.process.start()
        writer.close()  # the child's is the only write end: its death ends stdout
        self.stdout = os.fdopen(os.dup(reader.fileno()), "r", encoding="utf-8")
        reader.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise TimeoutError(f"{self.process.name} still runs after {timeout} s")
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.exitcode is None:
            os.kill(self.process.pid, signal.SIGKILL)
