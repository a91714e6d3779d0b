"""Worker 0's children: worker processes 1..N-1 started, watched, restarted and stopped.

Each child is ``flightstore serve`` on its own data directory (``<data-dir>/worker-<k>``) and a
free port, with the group's secret and cluster id in its environment (never on a command line,
where ``ps`` shows it) and a pipe on its standard input: when worker 0 goes away, even by kill -9,
the pipe closes and the child stops itself (see :func:`watch_parent`), so no orphan keeps a data
directory locked. A child that dies while worker 0 runs is reported (log and the
``flightstore.cluster`` action's ``processes``), its buckets announced unavailable, and it is started
again on its data directory (its acknowledged writes are there: the same recovery as any restart);
after :data:`MAX_RESTARTS` exits within :data:`RESTART_WINDOW_S` it is left down, reported so.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flightstore.cluster.local import ServerProcess
from flightstore.errors import FlightstoreError

__all__ = ["CLUSTER_ENV", "MAX_RESTARTS", "SECRET_ENV", "WorkerSupervisor", "watch_parent"]

log = logging.getLogger("flightstore.workers")

SECRET_ENV = "FLIGHTSTORE_WORKER_SECRET"
CLUSTER_ENV = "FLIGHTSTORE_WORKER_CLUSTER"
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
START_TIMEOUT_S = 180.0


class WorkerSupervisor:
    """Runs workers 1..``workers``-1 for worker 0 (``member``); ``args_of(k)``: worker k's
    ``serve`` arguments."""

    def __init__(self, member: Any, args_of: Callable[[int], Sequence[str]]) -> None:
        self.member = member
        self.args_of = args_of
        config = member.config
        self.env = {**os.environ, SECRET_ENV: config.secret.hex(), CLUSTER_ENV: member.catalog.cluster_id}
        self.children = {k: self._process(k) for k in range(1, config.workers)}
        self.restarts: dict[int, list[float]] = {k: [] for k in self.children}
        self.last_exit: dict[int, int | None] = {k: None for k in self.children}
        self.given_up: set[int] = set()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        member.supervisor = self

    def _process(self, worker: int) -> ServerProcess:
        return ServerProcess(list(self.args_of(worker)), env=self.env, stdin=subprocess.PIPE,
                             own_session=True)

    def start(self) -> None:
        """Start every child and return once each serves (joined worker 0); FlightstoreError (and
        every child stopped) when one does not."""
        with ThreadPoolExecutor(max_workers=len(self.children) or 1) as pool:
            started = [pool.submit(child.start, START_TIMEOUT_S) for child in self.children.values()]
            failure = next((f.exception() for f in started if f.exception() is not None), None)
        if failure is not None:
            self.stop()
            raise failure
        for worker in self.children:
            threading.Thread(target=self._watch, args=(worker,), name=f"worker-{worker}-watch",
                             daemon=True).start()

    def _watch(self, worker: int) -> None:
        """Wait for the child to exit; unless stopping, report it and start it again."""
        while not self._stopping.is_set():
            child = self.children[worker]
            code = child.process.wait()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            with self._lock:
                self.last_exit[worker] = code
                recent = [t for t in self.restarts[worker] if now - t < RESTART_WINDOW_S]
                self.restarts[worker] = recent + [now]
            log.error("worker %d (pid %d) exited with code %s; its buckets are unavailable until it is back",
                      worker, child.pid, code)
            self.member.leave(worker)
            if len(recent) >= MAX_RESTARTS:
                with self._lock:
                    self.given_up.add(worker)
                log.error("worker %d exited %d times within %.0f s: not restarting it; stop the server, "
                          "look at its log and start again", worker, len(recent) + 1, RESTART_WINDOW_S)
                return
            fresh = self._process(worker)
            try:
                fresh.start(START_TIMEOUT_S)
            except FlightstoreError as exc:
                log.error("worker %d did not start again: %s", worker, exc)
                self.children[worker] = fresh
                if fresh.process is None:
                    return
                continue
            self.children[worker] = fresh
            log.warning("worker %d restarted (pid %d) at %s", worker, fresh.pid, fresh.uri)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM every child (in parallel), wait for each (SIGKILL after ``timeout``)."""
        self._stopping.set()
        children = list(self.children.values())
        for child in children:
            if child.alive():
                child.process.send_signal(signal.SIGTERM)
        for child in children:
            child.stop(timeout)

    def status(self) -> dict[str, Any]:
        """Per child: pid, alive, restarts within the window, last exit code, given up."""
        with self._lock:
            return {str(k): {"pid": c.process.pid if c.process is not None else None, "alive": c.alive(),
                             "uri": c.uri, "restarts": len(self.restarts[k]), "last_exit": self.last_exit[k],
                             "given_up": k in self.given_up}
                    for k, c in self.children.items()}


def watch_parent() -> None:
    """In a worker child: SIGTERM this process when standard input (the pipe from worker 0) ends."""
    def wait() -> None:
        try:  # the raw descriptor: a buffered reader's lock would stall the interpreter's exit
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        log.warning("worker 0 went away: stopping")
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=wait, name="worker-parent-watch", daemon=True).start()
