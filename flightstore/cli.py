"""The ``flightstore`` command line: ``serve``, ``sql``, ``verify``, ``repair``, ``options``."""

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


def _verify(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is lost or unreadable, 1 when something is, 2 when it cannot run."""
    from flightstore.errors import DataDirectoryInUse
    from flightstore.maintenance import verify
    try:
        report = verify(args.data_dir)
    except DataDirectoryInUse as exc:
        print(f"flightstore verify: {exc}", file=sys.stderr)
        return 2
    return _print_report("verify", report)


def _repair(args: argparse.Namespace) -> int:
    """Exit 0 when every table opens and reads again, 1 otherwise, 2 when it cannot run."""
    from flightstore.errors import FlightstoreError
    from flightstore.maintenance import repair
    try:
        report = repair(args.data_dir, args.table or None, fsync=args.fsync)
    except FlightstoreError as exc:
        print(f"flightstore repair: {exc}", file=sys.stderr)
        return 2
    return _print_report("repair", report)


def _print_report(command: str, report) -> int:
    for finding in report.findings:
        print(finding)
    print(f"flightstore {command}: {report.summary()}")
    return 0 if report.ok else 1


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
    verify = commands.add_parser("verify", help="check every CRC, checksum and KV block of a data "
                                 "directory and report, changing nothing (exit 1 if data is lost)")
    verify.add_argument("data_dir", metavar="DATA_DIR")
    verify.set_defaults(func=_verify)
    repair = commands.add_parser("repair", help="make damaged tables readable again: declare the "
                                 "lost offsets, quarantine bad bytes, say what was lost")
    repair.add_argument("data_dir", metavar="DATA_DIR")
    repair.add_argument("--table", action="append", metavar="DB.TABLE",
                        help="repair only this table (repeatable; default: every table)")
    repair.add_argument("--fsync", action=argparse.BooleanOptionalAction,
                        default=SERVER_OPTIONS["log.fsync"].default,
                        help="fsync what repair writes (default: on)")
    repair.set_defaults(func=_repair)
    options = commands.add_parser("options", help="print every option as a Markdown table")
    options.set_defaults(func=lambda _: print(options_markdown()) or 0)
    args = parser.parse_args(argv)
    sys.exit(args.func(args))
