"""Child process of the tiering crash test: tiers a table round after round and kills itself with
SIGKILL at a chosen point of a chosen round.

The tests call :func:`tier`, which forks the child from a multiprocessing fork server that imported
flightstore's lake once (a fresh interpreter spent most of a crash test importing pyiceberg,
SQLAlchemy and the rest, once per kill). The child is a separate process all the same: it opens
the data directory itself and dies by SIGKILL at the point, as a tiering server would.

By hand: python -m tests.lake.tier_child DATA_DIR MAX_ROUND_ROWS KILL_ROUND KILL_PHASE [OPTIONS_JSON [TABLE]]
KILL_PHASE is one of flightstore.lake.tiering.PHASES or ``none`` (tier everything, exit 0);
OPTIONS_JSON holds further server options (an S3 warehouse); TABLE defaults to default.events.
The kill point comes in through the tierer's ``hook``; nothing in flightstore knows about tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Any

from flightstore.lake import LakeSettings, LakeTierer
from flightstore.store import Store


def run(data_dir: str, max_rows: str, kill_round: int, kill_phase: str, options: dict[str, Any],
        name: str = "default.events") -> int:
    """Tier ``name`` until nothing is left, SIGKILLing this process at ``kill_phase`` of round
    ``kill_round``; returns the number of rounds when the kill point never came."""
    rounds = {"n": 0}

    def hook(phase: str) -> None:
        if phase == "before-write":
            rounds["n"] += 1
        if phase == kill_phase and rounds["n"] == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)

    with Store(data_dir) as store:
        settings = LakeSettings.from_options(data_dir, {**options, "datalake.tiering.max-round-rows": max_rows})
        tierer = LakeTierer(store, settings, hook=hook)
        while tierer.tier_now(name).committed:
            pass
        tierer.stop()
    return rounds["n"]


def _child(report: Any, *args: Any) -> None:
    try:
        rounds = run(*args)
    except BaseException:
        report.send(traceback.format_exc())
        raise
    report.send(f"done {rounds}")


def tier(data_dir: str, max_rows: str, kill_round: int, kill_phase: str, options: dict[str, Any],
         name: str = "default.events", timeout: float = 300) -> tuple[int, str]:
    """:func:`run` in a child forked from the preloaded fork server. Returns its exit code (0: it
    tiered everything; ``-SIGKILL``: it killed itself at the point) and its report (``done N`` or
    the traceback it failed with); a child still running after ``timeout`` is killed and fails
    the test."""
    from tests.forked_server import fork_context
    context = fork_context()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, data_dir, max_rows, kill_round, kill_phase, options, name),
                            daemon=True)
    child.start()
    send.close()
    try:
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join(30)
            raise AssertionError(f"the tiering child did not finish within {timeout:g} s")
        try:
            report = receive.recv()
        except EOFError:  # killed before it reported anything
            report = ""
        return child.exitcode, report
    finally:
        receive.close()


def main() -> None:
    data_dir, max_rows, kill_round, kill_phase = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    rounds = run(data_dir, max_rows, kill_round, kill_phase, options, *sys.argv[6:7])
    print("done", rounds, flush=True)


if __name__ == "__main__":
    main()
