"""A local ZooKeeper server process, for ``flightstore cluster`` and the tests.

ZooKeeper comes from the Debian ``zookeeper`` package (3.8): :func:`ensure_installed` installs it
(:mod:`flightstore.debian`) when it is missing and this process may. The server runs as a
plain JVM (``ZooKeeperServerMain``, standalone) with a generated ``zoo.cfg`` and its own data
directory, listening on loopback only; the jar's manifest names its dependencies, so the class
path is the one jar. Its admin HTTP server is off (it would take port 8080).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from flightstore import debian
from flightstore.errors import FlightstoreError

__all__ = ["ZOOKEEPER_JAR", "ZooKeeperServer", "ensure_installed", "free_port"]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def ensure_installed() -> Path:
    """The ZooKeeper jar, installing the Debian package (and Java) first if needed."""
    if ZOOKEEPER_JAR.exists() and shutil.which("java"):
        return ZOOKEEPER_JAR
    debian.install({"zookeeper": str(ZOOKEEPER_JAR), "default-jre-headless": "java"})
    if not (ZOOKEEPER_JAR.exists() and shutil.which("java")):
        raise FlightstoreError("ZooKeeper is not installed and could not be installed: run "
                               "`apt-get install zookeeper` (Debian's ZooKeeper 3.8, with Java)")
    return ZOOKEEPER_JAR


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the caller binds it soon after)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _ruok(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"ruok")
            return sock.recv(16) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    """A standalone ZooKeeper on ``host:port`` (0: a free port) keeping its data in ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1",
                 tick_ms: int = 500) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.tick_ms = tick_ms
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 120.0) -> ZooKeeperServer:
        """Start the JVM and return once it answers ``ruok``; FlightstoreError if it does not."""
        jar = ensure_installed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={self.tick_ms}", f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}", f"clientPortAddress={self.host}",
            "maxClientCnxns=0", "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,stat",
            f"minSessionTimeout={2 * self.tick_ms}", "maxSessionTimeout=120000",
            "autopurge.purgeInterval=1", ""]))
        with open(self.data_dir / "zookeeper.log", "ab") as log:
            self.process = subprocess.Popen(
                [shutil.which("java") or "java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC",
                 "-XX:TieredStopAtLevel=1", "-cp", str(jar), _MAIN, str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _ruok(self.host, self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.data_dir / "zookeeper.log").read_text(errors="replace")[-2000:]
                raise FlightstoreError(f"ZooKeeper did not start on {self.address}:\n{tail}")
            time.sleep(0.1)  # poll interval of the readiness check above
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``timeout``); the data directory stays."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
