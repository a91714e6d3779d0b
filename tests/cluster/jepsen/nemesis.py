"""The nemesis of the Jepsen-style test: faults on real server processes, chosen by a seeded RNG.

Faults (one at a time, sometimes a second while the first lasts; in rounds that shuffle every
kind, a pause second):

* ``kill``: kill -9 of a random server, of a bucket leader, or of the coordinator; restarted
  (same port, same data directory) a few seconds later;
* ``pause``: SIGSTOP of a bucket leader for longer than the ZooKeeper session timeout, then
  SIGCONT: it comes back a deposed leader (a zombie) that must refuse writes and step down;
* ``wipe``: kill -9 and delete the data directory (a disk lost); it restarts empty and must
  catch up as a follower, never serving what it does not have.

Every fault and heal goes to the history with the time. :meth:`Nemesis.heal` resumes and restarts
everything and waits until every server is registered again.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from tests.cluster.conftest import Observer, Servers
from tests.cluster.jepsen.history import HistoryWriter

__all__ = ["Nemesis"]


class Nemesis:
    """Faults on ``servers`` (ids ``ids``, each on its fixed port ``ports[id]``) for a run."""

    def __init__(self, servers: Servers, observer: Observer, ids: Sequence[int], ports: dict[int, int],
                 extra: Sequence[str], history: HistoryWriter, seed: int, session_timeout_s: float,
                 wipe: bool = True) -> None:
        self.servers = servers
        self.observer = observer
        self.ids = list(ids)
        self.ports = ports
        self.extra = list(extra)
        self.history = history
        self.rng = random.Random(seed)
        self.session_timeout_s = session_timeout_s
        self.wipe = wipe
        self.down: set[int] = set()     # killed, to restart
        self.paused: set[int] = set()   # SIGSTOPped, to resume
        self.faults = 0
        self._schedule: list[str] = []
        self.crashes: list[dict[str, Any]] = []  # servers that died without the nemesis killing them
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # ---- servers ------------------------------------------------------------------------------
    def start_server(self, server_id: int) -> str:
        """Start (or restart) a server on its port; a port still held by the dead process's
        socket is retried for a while."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return self.servers.start(server_id, *self.extra, "--port", str(self.ports[server_id])).uri
            except Exception:  # noqa: BLE001 - the port may linger a moment after a kill -9
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _live(self) -> list[int]:
        return [i for i in self.ids if i not in self.down and i not in self.paused]

    def _leaders(self) -> list[int]:
        view = self.observer.cache.view()
        return sorted({b.leader for r in view.tables.values() for b in r.buckets if b.leader in self._live()})

    def _pick(self, how: str) -> int | None:
        live = self._live()
        if not live:
            return None
        if how == "leader":
            leaders = self._leaders()
            return self.rng.choice(leaders) if leaders else self.rng.choice(live)
        if how == "coordinator":
            coordinator = self.observer.cache.view().coordinator
            return coordinator if coordinator in live else self.rng.choice(live)
        return self.rng.choice(live)

    def _note(self, what: str, server: int, **extra: Any) -> None:
        self.history.write({"ev": "nemesis", "what": what, "server": server, **extra})

    def kill(self, server: int, *, wipe: bool = False) -> None:
        self.servers.running[server].kill()
        if wipe:
            shutil.rmtree(self.servers.root / f"server-{server}", ignore_errors=True)
        self.down.add(server)
        self._note("wipe" if wipe else "kill", server)

    def pause(self, server: int) -> None:
        os.kill(self.servers.running[server].pid, signal.SIGSTOP)
        self.paused.add(server)
        self._note("pause", server)

    def resume(self, server: int) -> None:
        os.kill(self.servers.running[server].pid, signal.SIGCONT)
        self.paused.discard(server)
        self._note("resume", server)

    def restart(self, server: int) -> None:
        uri = self.start_server(server)
        self.down.discard(server)
        self._note("restart", server, uri=uri)

    def check_crashes(self) -> None:
        """Note every server that died on its own (a crash: its exit code, e.g. -11 for SIGSEGV;
        its log holds Python's fault handler traceback) and count it as down, to restart."""
        for server in self.ids:
            process = self.servers.running.get(server)
            if server not in self.down and process is not None and not process.alive():
                code = process.exitcode
                self.crashes.append({"server": server, "exit_code": code, "t": time.time()})
                self._note("crash", server, exit_code=code)
                self.paused.discard(server)
                self.down.add(server)

    def heal(self, timeout: float = 180) -> None:
        """Resume every paused server, restart every dead one, and wait until all are registered."""
        self.check_crashes()
        self.check_crashes()
        for server in sorted(self.paused):
            self.resume(server)
        for server in sorted(self.down):
            self.restart(server)
        self.observer.wait(lambda v: set(v.servers) == set(self.ids) and v.coordinator is not None,
                           "every server registered after healing", timeout)

    # ---- the fault loop -----------------------------------------------------------------------
    def start(self, seconds: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(seconds,), name="nemesis", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 300) -> None:
        """Stop injecting faults (the current one is healed first) and heal everything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.heal()
        if self.error is not None:
            raise self.error

    def _wait(self, low: float, high: float) -> None:
        self._stop.wait(self.rng.uniform(low, high))
        self.check_crashes()

    def _run(self, seconds: float) -> None:
        try:
            end = time.monotonic() + seconds
            while not self._stop.is_set() and time.monotonic() < end:
                self._one_fault()
                self._wait(1.0, 4.0)  # quiet time: the cluster settles, writes go through
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc
            self._note("error", -1, error=repr(exc))

    def _next_fault(self) -> str:
        """The faults come in rounds, each a seeded shuffle of every kind with a zombie leader
        (pause) second, so that a short run has one of each early."""
        if not self._schedule:
            kinds = ["kill:coordinator", "kill:leader", "kill:random"] + (["wipe:random"] if self.wipe else [])
            kinds = self.rng.sample(kinds, len(kinds))
            self._schedule = [kinds[0], "pause:leader", *kinds[1:]]
        return self._schedule.pop(0)

    def _one_fault(self) -> None:
        what, how = self._next_fault().split(":")
        victim = self._pick(how)
        if victim is None:
            return
        self.faults += 1
        if what == "pause":
            self.pause(victim)
            self._stop.wait(self.session_timeout_s + self.rng.uniform(1.0, 4.0))  # past its session
        else:
            self.kill(victim, wipe=what == "wipe")
            self._wait(1.0, 6.0)
        if self.rng.random() < 0.2 and not self._stop.is_set():  # a second fault while the first lasts
            second = self._pick("random")
            if second is not None:
                self.kill(second)
                self._wait(1.0, 5.0)
        self.check_crashes()
        for server in sorted(self.paused):
            self.resume(server)
        for server in sorted(self.down):
            self.restart(server)
