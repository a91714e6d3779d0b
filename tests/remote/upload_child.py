"""Child process of the remote storage crash test: writes and uploads in a loop.

Usage: python -m tests.remote.upload_child DATA_DIR REMOTE_DIR
Each round appends 10 rows (``seq`` continuing from the table's row count), prints the row count
acknowledged, then uploads the closed segments and deletes the local ones past
``table.log.tiered.local-segments``: the parent kills it with SIGKILL anywhere in that loop.
"""

from __future__ import annotations

import sys

from flightstore.remote import RemoteLogManager
from flightstore.store import Store
from tests.remote.tables import EVENTS, TIERED, events


def main() -> None:
    data_dir, remote_dir = sys.argv[1], sys.argv[2]
    with Store(data_dir, fsync=False, options={"remote.data.dir": remote_dir}) as store:
        table = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED},
                                   if_not_exists=True)
        manager = RemoteLogManager(store, 1000)
        print("ready", flush=True)
        while True:
            written = table.row_count()
            table.write(events(written, 10))
            print(written + 10, flush=True)
            manager.run_once()


if __name__ == "__main__":
    main()
