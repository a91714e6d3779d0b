"""Merge engines: how a primary-key table folds a write batch into its stored rows.

One interface, :class:`~flightstore.kv.merge.base.RowMerger`, one small class per engine, chosen by
``table.merge-engine`` through :func:`merger_for`.
"""

from __future__ import annotations

from flightstore.kv.merge.base import MergeInput, MergeResult, RowMerger
from flightstore.kv.merge.first_row import FirstRowMerger
from flightstore.kv.merge.last_row import LastRowMerger
from flightstore.kv.merge.versioned import VersionedMerger
from flightstore.schema import TableDescriptor

__all__ = ["MergeInput", "MergeResult", "RowMerger", "LastRowMerger", "FirstRowMerger",
           "VersionedMerger", "merger_for"]


def merger_for(descriptor: TableDescriptor) -> RowMerger:
    """The merge engine a primary-key table is configured with."""
    engine = descriptor.merge_engine
    if engine == "first_row":
        return FirstRowMerger(descriptor)
    if engine == "versioned":
        return VersionedMerger(descriptor)
    if engine == "aggregation":
        from flightstore.kv.merge.aggregation import AggregationMerger
        return AggregationMerger(descriptor)
    return LastRowMerger(descriptor)
