"""Child process of the read-cache crash test: a union read of ``default.events`` that kills
itself with SIGKILL once the read cache holds a partly written file (mid-fill).

Usage: python -m tests.lake.cache_child DATA_DIR
"""

from __future__ import annotations

import os
import signal
import sys

from flightstore.lake import LakeCatalog, LakeSettings
from flightstore.lake.union import read_union
from flightstore.store import Store


def main() -> None:
    data_dir = sys.argv[1]
    with Store(data_dir) as store:
        catalog = LakeCatalog(LakeSettings.from_options(data_dir, {}))
        table = store.table("default.events")
        for _ in read_union(catalog, table, table.schema.names):
            partial = [p for p in catalog.read_cache.directory.iterdir() if p.name.endswith(".partial")]
            if partial and partial[0].stat().st_size > 0:
                print("killing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    print("no partial file seen", flush=True)


if __name__ == "__main__":
    main()
