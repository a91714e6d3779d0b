"""The ``flightstore`` command line: ``serve``, ``sql``, ``options``."""

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
    serve.add_argument("--fsync", action=argparse.BooleanOptionalAction,
                       default=SERVER_OPTIONS["log.fsync"].default, help=SERVER_OPTIONS["log.fsync"].doc)
    serve.add_argument("--user", action="append", metavar="NAME:PASSWORD",
                       help="require Basic authentication; repeat for several users (default: open)")
    serve.set_defaults(func=_serve)
    sql = commands.add_parser("sql", help="run SQL statements against a server")
    sql.add_argument("--uri", default="grpc://127.0.0.1:8815")
    sql.add_argument("--user", help="NAME:PASSWORD for a server that requires authentication")
    sql.add_argument("statements", nargs="+")
    sql.set_defaults(func=_sql)
    options = commands.add_parser("options", help="print every option as a Markdown table")
    options.set_defaults(func=lambda _: print(options_markdown()) or 0)
    args = parser.parse_args(argv)
    sys.exit(args.func(args))
