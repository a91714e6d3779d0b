"""Where the lake lives and how tiering behaves: server options resolved against the data directory.

The embedded default needs no other process: a pyiceberg SQL catalog on sqlite at
``DATA_DIR/lake/catalog.db`` and data files under ``DATA_DIR/lake/warehouse``. The warehouse may
instead be ``s3://bucket/prefix`` on any S3-compatible object storage (endpoint, keys, region), and
the catalog any SQLAlchemy URI. Every ``datalake.iceberg.<property>`` server option passes through
to the catalog as pyiceberg property ``<property>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightstore.config import ICEBERG_CATALOG_PREFIX, server_option, validate_server_options

__all__ = ["CATALOG_NAME", "LakeSettings"]

CATALOG_NAME = "flightstore"  # the pyiceberg catalog name every tierer and reader of the lake uses


@dataclass(frozen=True)
class LakeSettings:
    """Resolved lake options of one data directory. Build with :meth:`from_options`."""

    data_dir: Path
    catalog_uri: str
    warehouse: str
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    format: str = "iceberg"
    tiering_enabled: bool = True
    lease_ms: int = 60_000
    retry_backoff_max_ms: int = 60_000
    max_round_rows: int = 8_000_000
    read_cache_size: int = 0
    maintenance_interval_ms: int = 3_600_000

    @classmethod
    def from_options(cls, data_dir: str | Path, options: Mapping[str, Any] | None = None) -> LakeSettings:
        """Resolve server ``options`` (registry keys, raw or typed) for ``data_dir``.

        Raises :class:`~flightstore.errors.InvalidOption` for an unknown or ill-typed option.
        """
        typed = validate_server_options(options or {})
        data_dir = Path(data_dir).resolve()
        uri = server_option(typed, "datalake.iceberg.uri") or \
            f"sqlite:///{data_dir / 'lake' / 'catalog.db'}"
        warehouse = server_option(typed, "datalake.iceberg.warehouse") or str(data_dir / "lake" / "warehouse")
        if "://" not in warehouse:
            warehouse = Path(warehouse).resolve().as_uri()
        properties = {key[len(ICEBERG_CATALOG_PREFIX):]: str(value) for key, value in typed.items()
                      if key.startswith(ICEBERG_CATALOG_PREFIX) and value is not None
                      and key not in ("datalake.iceberg.uri", "datalake.iceberg.warehouse")}
        return cls(
            data_dir=data_dir, catalog_uri=uri, warehouse=warehouse.rstrip("/"),
            catalog_properties=properties, format=server_option(typed, "datalake.format"),
            tiering_enabled=server_option(typed, "datalake.tiering.enabled"),
            lease_ms=server_option(typed, "datalake.tiering.lease"),
            retry_backoff_max_ms=server_option(typed, "datalake.tiering.retry-backoff.max"),
            max_round_rows=server_option(typed, "datalake.tiering.max-round-rows"),
            read_cache_size=server_option(typed, "datalake.read-cache.size"),
            maintenance_interval_ms=server_option(typed, "datalake.maintenance.interval"))

    @property
    def local_warehouse(self) -> Path | None:
        """The warehouse directory when it is on the local file system, else None."""
        if self.warehouse.startswith("file://"):
            return Path(self.warehouse[len("file://"):])
        return None

    @property
    def read_cache_dir(self) -> Path:
        """Where the read cache of decoded lake data files lives (:mod:`flightstore.lake.cache`)."""
        return self.data_dir / "lake" / "read-cache"

    def pyiceberg_properties(self) -> dict[str, str]:
        """Properties of the pyiceberg SqlCatalog: URI, warehouse, then the pass-through ones."""
        return {"uri": self.catalog_uri, "warehouse": self.warehouse, **self.catalog_properties}
