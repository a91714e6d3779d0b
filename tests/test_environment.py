"""The runtime dependencies behave the way flightstore's hot paths assume."""

from __future__ import annotations

import builtins

import pyarrow as pa


def test_pyarrow_type_inference_imports_nothing_that_fails(monkeypatch) -> None:
    """pyarrow infers a Python list's type by trying ``import dateutil.relativedelta``; while that
    import fails it is retried on every conversion (a sys.path search, ~60 us). The dependency on
    python-dateutil makes it succeed once and be cached."""
    pa.array([1])  # the first call may import for real
    failed: list[str] = []
    real_import = builtins.__import__

    def recording_import(name, *args, **kwargs):
        try:
            return real_import(name, *args, **kwargs)
        except ImportError:
            failed.append(name)
            raise

    monkeypatch.setattr(builtins, "__import__", recording_import)
    pa.array([1, 2, None])
    pa.table({"id": [1], "name": ["a"]})
    assert failed == []
