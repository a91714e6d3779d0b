"""Run every ``bench/bench_*.py`` (each defines ``run() -> list[Row]``) and print one table.

``python -m bench [name ...]`` runs only the named benchmarks (e.g. ``storage``; ``spark`` also runs
``bench_spark_*``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from bench.report import print_table


def main() -> None:
    wanted = set(sys.argv[1:])
    rows = []
    for module in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if not module.name.startswith("bench_"):
            continue
        name = module.name.removeprefix("bench_")
        if wanted and not any(name == w or name.startswith(f"{w}_") for w in wanted):  # spark: spark_join too
            continue
        print(f"running {module.name} ...", file=sys.stderr, flush=True)
        rows.extend(importlib.import_module(f"bench.{module.name}").run())
    print_table(rows)


main()
