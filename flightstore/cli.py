"""The ``flightstore`` command line: ``serve``, ``sql``, ``snapshot``, ``options``."""

from __future__ import annotations

import argparse
import sys

from flightstore.config import SERVER_OPTIONS, options_markdown

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    from flightstore.server.service import serve
    users = {}
    for spec in args.user or []:
        name, sep, password = spec.partition(":")
        if not sep or not name:
            raise SystemExit(f"--user expects NAME:PASSWORD, got {spec!r}")
        users[name] = password
    serve(args.data_dir, host=args.host, port=args.port, fsync=args.fsync, users=users or None)
    return 0


def _sql(args: argparse.Namespace) -> int:
    import flightstore
    name, _, password = (args.user or "").partition(":")
    with flightstore.connect(args.uri, username=name or None, password=password) as conn:
        for statement in args.statements:
            result = conn.sql(statement)
            print(result.to_pandas().to_string(index=False) if _has_pandas() else result)
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    """Take KV snapshots now: through a running server (``--uri``) or, with the server stopped,
    directly in ``--data-dir``. Prints one line per bucket."""
    if args.data_dir:
        from flightstore.store import Store
        with Store(args.data_dir) as store:
            for name in args.tables:
                table = store.table(name)
                taken = table.snapshot(force=args.force)
                table.enforce_retention()
                for bucket, info in taken.items():
                    _print_snapshot(name, bucket, None if info is None else
                                    {"id": info.id, "offset": info.offset, "rows": info.rows})
        return 0
    import flightstore
    name, _, password = (args.user or "").partition(":")
    with flightstore.connect(args.uri, username=name or None, password=password) as conn:
        for table in args.tables:
            for bucket, info in conn.table(table).snapshot(force=args.force).items():
                _print_snapshot(table, bucket, info)
    return 0


def _print_snapshot(table: str, bucket: int, info: dict | None) -> None:
    if info is None:
        print(f"{table} bucket {bucket}: empty, no snapshot")
    else:
        print(f"{table} bucket {bucket}: snapshot {info['id']} at log offset {info['offset']} "
              f"({info['rows']} rows)")


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
        return True
    except ImportError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flightstore", description="Streaming storage over Arrow Flight SQL")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the Flight SQL server")
    serve.add_argument("--data-dir", default=SERVER_OPTIONS["data-dir"].default,
                       help=SERVER_OPTIONS["data-dir"].doc)
    serve.add_argument("--host", default=SERVER_OPTIONS["host"].default, help=SERVER_OPTIONS["host"].doc)
    serve.add_argument("--port", type=int, default=SERVER_OPTIONS["port"].default,
                       help=SERVER_OPTIONS["port"].doc)
    serve.add_argument("--fsync", action="store_true", help=SERVER_OPTIONS["log.fsync"].doc)
    serve.add_argument("--user", action="append", metavar="NAME:PASSWORD",
                       help="require Basic authentication; repeat for several users (default: open)")
    serve.set_defaults(func=_serve)
    sql = commands.add_parser("sql", help="run SQL statements against a server")
    sql.add_argument("--uri", default="grpc://127.0.0.1:8815")
    sql.add_argument("--user", help="NAME:PASSWORD for a server that requires authentication")
    sql.add_argument("statements", nargs="+")
    sql.set_defaults(func=_sql)
    snapshot = commands.add_parser("snapshot", help="take KV snapshots of primary-key tables now")
    snapshot.add_argument("--uri", default="grpc://127.0.0.1:8815", help="the server to ask")
    snapshot.add_argument("--data-dir", help="work on this data directory directly (server stopped)")
    snapshot.add_argument("--user", help="NAME:PASSWORD for a server that requires authentication")
    snapshot.add_argument("--force", action="store_true", help="even if a bucket did not change")
    snapshot.add_argument("tables", nargs="+", metavar="TABLE", help="db.table")
    snapshot.set_defaults(func=_snapshot)
    options = commands.add_parser("options", help="print every option as a Markdown table")
    options.set_defaults(func=lambda _: print(options_markdown()) or 0)
    args = parser.parse_args(argv)
    sys.exit(args.func(args))
