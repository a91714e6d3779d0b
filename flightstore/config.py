"""One typed registry of every option flightstore reads, server-wide and per table.

Each :class:`ConfigOption` carries its key, type, default and documentation; the CLI help and the
README option table are generated from this registry (``python -m flightstore options``). Table
options use the names Apache Fluss users know. Validation is strict: an unknown key or a value that
does not parse is refused with a message naming the option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flightstore.errors import InvalidOption

__all__ = [
    "ConfigOption",
    "TABLE_OPTIONS",
    "SERVER_OPTIONS",
    "FIELD_OPTION_PATTERN",
    "parse_duration_ms",
    "validate_table_options",
    "table_option",
    "server_option",
    "options_markdown",
]


def parse_duration_ms(text: str) -> int:
    """Parse a Fluss-style duration (``7d``, ``2 h``, ``30min``, ``500ms``, ``10s``) to milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|sec|min|m|h|d|)\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 7d, 12h, 30min, 10s, 500ms)")
    value, unit = int(match.group(1)), match.group(2)
    scale = {"ms": 1, "": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000,
             "h": 3_600_000, "d": 86_400_000}[unit]
    return value * scale


def _parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in str(text).split(",") if part.strip())


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": lambda text: int(str(text).strip()),
    "bool": _parse_bool,
    "str": str,
    "duration": parse_duration_ms,
    "list": _parse_list,
}


@dataclass(frozen=True)
class ConfigOption:
    """One option: ``key``, value ``type`` (int, bool, str, duration, list), default and doc."""

    key: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None

    def parse(self, raw: Any) -> Any:
        """Return the typed value of ``raw``; raise :class:`InvalidOption` naming this option."""
        try:
            value = _PARSERS[self.type](raw)
        except (ValueError, TypeError) as exc:
            raise InvalidOption(f"option '{self.key}': {exc}") from None
        if self.choices is not None:
            normalized = str(value).strip()
            matches = [c for c in self.choices if c.lower() == normalized.lower()]
            if not matches:
                raise InvalidOption(
                    f"option '{self.key}': {raw!r} is not one of {', '.join(self.choices)}")
            value = matches[0]
        if self.minimum is not None and value < self.minimum:
            raise InvalidOption(f"option '{self.key}': {value} is below the minimum {self.minimum}")
        return value


def _registry(*options: ConfigOption) -> dict[str, ConfigOption]:
    return {option.key: option for option in options}


TABLE_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("bucket.num", "int", 1, "Number of buckets of the table.", minimum=1),
    ConfigOption("bucket.key", "list", (),
                 "Columns hashed to choose the bucket; default: the primary key (minus partition "
                 "keys) for primary-key tables, round-robin by batch for log tables."),
    ConfigOption("table.merge-engine", "str", None,
                 "How a primary-key table merges rows with the same key; unset means the last row "
                 "wins.", choices=("first_row", "versioned", "aggregation")),
    ConfigOption("table.merge-engine.versioned.ver-column", "str", None,
                 "Version column of the `versioned` merge engine: a row replaces the stored one when "
                 "its version is greater or equal; rows with a null version are ignored."),
    ConfigOption("table.delete.behavior", "str", "allow",
                 "What deletes do: `allow` them, `ignore` them silently or `disable` (refuse).",
                 choices=("allow", "ignore", "disable")),
    ConfigOption("table.changelog.image", "str", "FULL",
                 "`FULL` writes -U before-images into the changelog, `WAL` only the +U after-images.",
                 choices=("FULL", "WAL")),
    ConfigOption("table.log.ttl", "duration", 7 * 86_400_000,
                 "Log segments whose newest batch is older than this are deleted."),
    ConfigOption("table.log.arrow.compression.type", "str", "NONE",
                 "Compression of the Arrow IPC log batches.", choices=("NONE", "LZ4_FRAME", "ZSTD")),
    ConfigOption("table.log.segment.bytes", "int", 256 * 1024 * 1024,
                 "A log segment rolls to a new file past this size.", minimum=1024),
    ConfigOption("table.writer-id.expiration", "duration", 7 * 86_400_000,
                 "A writer id that has not written for this long is forgotten (its last batch "
                 "sequence, in memory, in the log's writer state and in the KV); a later batch of "
                 "it with a sequence above 0 is refused, as the retry check no longer holds.",
                 minimum=1),
    ConfigOption("table.statistics.columns", "list", ("*",),
                 "Columns with per-batch min/max/null-count statistics used to skip batches in "
                 "filtered reads; `*` means every column of a statistics-capable type."),
)

# Per-field options of the aggregation merge engine: fields.<field>.agg and
# fields.<field>.<function>.<param>.
FIELD_OPTION_PATTERN = re.compile(r"^fields\.([^.]+)\.(agg|[a-z_0-9]+\.[a-z_0-9-]+)$")

SERVER_OPTIONS: dict[str, ConfigOption] = _registry(
    ConfigOption("data-dir", "str", "./data", "Directory holding the catalog, logs and KV stores."),
    ConfigOption("host", "str", "127.0.0.1", "Address the Flight SQL server listens on."),
    ConfigOption("port", "int", 8815, "Port the Flight SQL server listens on.", minimum=0),
    ConfigOption("log.fsync", "bool", False,
                 "fsync every log append before acknowledging (survives power loss, not only a "
                 "process crash)."),
    ConfigOption("log.retention.check-interval", "duration", 60_000,
                 "How often the server deletes log segments past their table's `table.log.ttl`."),
    ConfigOption("server.max-batch-rows", "int", 65_536,
                 "Largest record batch sent in one Flight message."),
)


def validate_table_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Check every table option; return them normalized as strings (the persisted form).

    Raises :class:`InvalidOption` naming the first unknown or ill-typed option.
    """
    normalized: dict[str, str] = {}
    for key, raw in options.items():
        key = str(key)
        if key in TABLE_OPTIONS:
            value = TABLE_OPTIONS[key].parse(raw)
            normalized[key] = ",".join(value) if isinstance(value, tuple) else str(raw).strip()
            if TABLE_OPTIONS[key].choices:
                normalized[key] = value
        elif FIELD_OPTION_PATTERN.match(key):
            normalized[key] = str(raw)
        else:
            raise InvalidOption(f"unknown table option '{key}'")
    return normalized


def table_option(options: Mapping[str, str], key: str) -> Any:
    """The typed value of table option ``key`` in ``options``, or its default."""
    option = TABLE_OPTIONS[key]
    if key in options:
        return option.parse(options[key])
    return option.default


def server_option(options: Mapping[str, Any], key: str) -> Any:
    """The typed value of server option ``key`` in ``options``, or its default."""
    option = SERVER_OPTIONS[key]
    if options.get(key) is not None:
        return option.parse(options[key])
    return option.default


def options_markdown() -> str:
    """The README option table, generated from the registry."""
    lines = ["| option | scope | type | default | description |", "|---|---|---|---|---|"]
    for scope, registry in (("table", TABLE_OPTIONS), ("server", SERVER_OPTIONS)):
        for option in registry.values():
            default = ",".join(option.default) if isinstance(option.default, tuple) else option.default
            kind = "|".join(option.choices) if option.choices else option.type
            lines.append(f"| `{option.key}` | {scope} | {kind} | {default} | {option.doc} |")
    lines.append("| `fields.<field>.agg` | table | str | last_value_ignore_nulls | Aggregate function of "
                 "a field under the aggregation merge engine. |")
    return "\n".join(lines)
