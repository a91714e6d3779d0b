"""Streams of Arrow batches cut to a row limit, the one way every reader applies ``LIMIT``.

A scan pushes its limit down to each source (a KV chunk size, a forwarded call's ``limit``), and
still cuts what comes back: a source may answer more rows than asked, and the rows still wanted
shrink as batches go by. :func:`limited` cuts one stream; :func:`limited_sources` opens sources one
after the other, each with the rows still wanted, and stops opening them once the limit is reached.
Neither pulls a batch more than the limit needs, so a source stops reading when its consumer does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import pyarrow as pa

__all__ = ["limited", "limited_sources"]

Batch = TypeVar("Batch", pa.RecordBatch, pa.Table)


def limited(batches: Iterable[Batch], limit: int | None) -> Iterator[Batch]:
    """The non-empty ``batches``, the last one sliced so that at most ``limit`` rows come out in all
    (every row when ``limit`` is None). Stops pulling ``batches`` as soon as the limit is reached."""
    remaining = limit
    if remaining is not None and remaining <= 0:
        return
    for batch in batches:
        if remaining is not None:
            batch = batch.slice(0, remaining)
            remaining -= batch.num_rows
        if batch.num_rows:
            yield batch
        if remaining is not None and remaining <= 0:
            return


def limited_sources(sources: Iterable[Callable[[int | None], Iterable[Batch]]],
                    limit: int | None) -> Iterator[Batch]:
    """The batches of each source in turn, at most ``limit`` rows in all. A source is opened (called
    with the rows still wanted, None for all) only when the ones before it left rows to answer."""
    remaining = limit
    for open_source in sources:
        if remaining is not None and remaining <= 0:
            return
        for batch in limited(open_source(remaining), remaining):
            if remaining is not None:
                remaining -= batch.num_rows
            yield batch
