"""One result row of a benchmark: our figure, the peer's figure from the same run, and the ratio."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["Row", "best_of", "best_interleaved", "print_table"]


@dataclass(frozen=True)
class Row:
    """``higher_is_better`` decides how the ratio reads: ours/peer for rates, peer/ours for times."""

    workload: str
    ours: float
    peer: float
    unit: str
    peer_name: str
    higher_is_better: bool = True
    goal: str = ""

    @property
    def ratio(self) -> float:
        if self.higher_is_better:
            return self.ours / self.peer if self.peer else float("inf")
        return self.peer / self.ours if self.ours else float("inf")


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` runs of ``fn`` (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def best_interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best wall time (seconds) of each of ``fns`` over ``rounds`` rounds that each run every
    function once, in turn. Peers measured side by side see the same machine: a busy moment on a
    shared machine slows one round of each, not every run of one of them."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def print_table(rows: list[Row]) -> None:
    header = f"{'workload':<58} {'ours':>14} {'peer':>14}  {'unit':<10} {'ratio':>7}  {'goal':<8} peer"
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = f"{row.ratio:>6.2f}x" if row.ratio != float("inf") else "    n/a"
        print(f"{row.workload:<58} {_figure(row.ours):>14} {_figure(row.peer):>14}  {row.unit:<10} "
              f"{ratio}  {row.goal:<8} {row.peer_name}")


def _figure(value: float) -> str:
    return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
