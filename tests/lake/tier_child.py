"""Child process of the tiering crash test: tiers a table round after round and kills itself with
SIGKILL at a chosen point of a chosen round.

Usage: python -m tests.lake.tier_child DATA_DIR MAX_ROUND_ROWS KILL_ROUND KILL_PHASE [OPTIONS_JSON [TABLE]]
KILL_PHASE is one of flightstore.lake.tiering.PHASES or ``none`` (tier everything, exit 0);
OPTIONS_JSON holds further server options (an S3 warehouse); TABLE defaults to default.events.
The kill point comes in through the tierer's ``hook``; nothing in flightstore knows about tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from flightstore.lake import LakeSettings, LakeTierer
from flightstore.store import Store


def main() -> None:
    data_dir, max_rows, kill_round, kill_phase = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rounds = {"n": 0}

    def hook(phase: str) -> None:
        if phase == "before-write":
            rounds["n"] += 1
        if phase == kill_phase and rounds["n"] == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)

    with Store(data_dir) as store:
        options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
        settings = LakeSettings.from_options(data_dir, {**options, "datalake.tiering.max-round-rows": max_rows})
        tierer = LakeTierer(store, settings, hook=hook)
        name = sys.argv[6] if len(sys.argv) > 6 else "default.events"
        while tierer.tier_now(name).committed:
            pass
        tierer.stop()
    print("done", rounds["n"], flush=True)


if __name__ == "__main__":
    main()
