"""Reference folds used by the KV tests: the changelog fold and a sequential model of last-row."""

from __future__ import annotations

import pyarrow as pa

from flightstore import changetype


def fold_changelog(table, key_columns) -> dict:
    """Fold every bucket's changelog into {key tuple: row dict}, checking -U/-D match the state."""
    state: dict = {}
    for log in table.logs:
        for record in log.read(0):
            rows = pa.Table.from_batches([record.batch]).to_pylist()
            for row in rows:
                kind = row.pop(changetype.CHANGE_TYPE_COLUMN)
                key = tuple(row[c] for c in key_columns)
                if kind in (changetype.INSERT, changetype.UPDATE_AFTER):
                    if kind == changetype.INSERT:
                        assert key not in state, f"+I for existing key {key}"
                    state[key] = row
                elif kind == changetype.UPDATE_BEFORE:
                    assert state.get(key) == row, f"-U {row} does not match stored {state.get(key)}"
                elif kind == changetype.DELETE:
                    assert state.pop(key) == row
    return state


def kv_contents(table, key_columns) -> dict:
    rows = table.scan_table().to_pylist()
    return {tuple(r[c] for c in key_columns): r for r in rows}
