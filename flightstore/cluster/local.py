"""A whole cluster on one machine: ZooKeeper and N ``flightstore serve`` processes.

``flightstore cluster --servers 3 --data-dir D`` runs :class:`LocalCluster`: ZooKeeper keeps its
data in ``D/zookeeper``, server ``i`` (ids 1..N) in ``D/server-i``; the command prints every URI
and stops everything on Ctrl-C or SIGTERM. Run it again on the same ``D`` and the cluster comes
back with its tables. :class:`ServerProcess` is one server process (the tests use it too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

from flightstore.cluster.zookeeper import ZooKeeperServer
from flightstore.errors import FlightstoreError

__all__ = ["LocalCluster", "ServerProcess"]


class ServerProcess:
    """``flightstore serve`` as a child process; :attr:`uri` once it serves (it printed so)."""

    def __init__(self, args: Sequence[str], *, stderr: Path | None = None,
                 echo: Callable[[str], None] | None = None, env: dict[str, str] | None = None,
                 stdin: int = subprocess.DEVNULL, own_session: bool = False) -> None:
        """``env``: the process environment (default: this one's); ``stdin``: ``subprocess.PIPE``
        for a worker, which stops when its parent's end of the pipe closes; ``own_session``: a
        terminal's Ctrl-C reaches only the parent, which stops the process itself."""
        self.args = list(args)
        self.env = env
        self.stdin = stdin
        self.own_session = own_session
        self.stderr = stderr
        self.echo = echo
        self.uri: str | None = None
        self.lines: list[str] = []
        self.process: subprocess.Popen | None = None
        self._serving = threading.Event()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> ServerProcess:
        """Start the process; return once it prints its URI (FlightstoreError if it exits or
        stays silent for ``timeout`` seconds)."""
        self.uri = None
        self._serving.clear()
        with open(self.stderr, "ab") if self.stderr is not None else nullcontext() as err:
            self.process = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", *self.args],
                                            stdout=subprocess.PIPE, stderr=err, stdin=self.stdin,
                                            text=True, bufsize=1, env=self.env,
                                            start_new_session=self.own_session)
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()
        if not self._serving.wait(timeout) or self.uri is None:
            code = self.process.poll()
            self.kill()
            detail = self.stderr.read_text(errors="replace")[-3000:] if self.stderr else ""
            raise FlightstoreError(f"flightstore serve {' '.join(self.args)} did not start "
                                   f"(exit code {code}):\n{detail}")
        return self

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line)
            if self.echo is not None:
                self.echo(line)
            if line.startswith("flightstore serving") and " at " in line:
                self.uri = line.rsplit(" at ", 1)[1].strip()
                self._serving.set()
        self._serving.set()  # exited: start() sees no URI

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to ZooKeeper, the registration lingers until expiry."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


class LocalCluster:
    """ZooKeeper plus ``servers`` flightstore servers under ``data_dir``; ports from ``port``
    upwards (0: free ports), ZooKeeper on ``zookeeper_port`` (0: a free port)."""

    def __init__(self, data_dir: str | os.PathLike, servers: int = 3, *, host: str = "127.0.0.1",
                 port: int = 8815, zookeeper_port: int = 0, extra_args: Sequence[str] = (),
                 echo: Callable[[str], None] | None = None) -> None:
        if servers < 1:
            raise FlightstoreError("a cluster needs at least one server")
        self.data_dir = Path(data_dir)
        self.zookeeper = ZooKeeperServer(self.data_dir / "zookeeper", port=zookeeper_port, host=host)
        # Every server derives the token-signing secret from this file (flightstore.cluster.security).
        self.secret_file = self.data_dir / "cluster-secret"
        self.servers = {
            server_id: ServerProcess(
                ["--zookeeper", f"{self.zookeeper.address}/flightstore", "--server-id", str(server_id),
                 "--data-dir", str(self.data_dir / f"server-{server_id}"), "--host", host,
                 "--port", str(port + server_id - 1 if port else 0),
                 "--cluster-secret-file", str(self.secret_file), *extra_args],
                stderr=self.data_dir / f"server-{server_id}.log", echo=echo)
            for server_id in range(1, servers + 1)}

    def start(self, timeout: float = 180.0) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.secret_file.exists():  # made once, kept with the cluster's data
            fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(os.urandom(32).hex())
        self.zookeeper.start(timeout)
        try:
            for server in self.servers.values():
                server.start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server (SIGTERM, in parallel), then ZooKeeper."""
        for server in self.servers.values():
            if server.alive():
                server.process.send_signal(signal.SIGTERM)
        for server in self.servers.values():
            server.stop()
        self.zookeeper.stop()
