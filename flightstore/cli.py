"""The ``flightstore`` command line: ``serve``, ``cluster``, ``sql``, ``verify``, ``repair``,
``options``."""

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
    serve(args.data_dir, host=args.host, port=args.port, fsync=args.fsync, users=users or None,
          cluster=_cluster_config(args))
    return 0


def _cluster_config(args: argparse.Namespace):
    """The ClusterConfig of ``serve --zookeeper ...``; None for a single server."""
    if not args.zookeeper:
        if args.server_id is not None or args.advertised_uri:
            raise SystemExit("--server-id and --advertised-uri need --zookeeper")
        return None
    if args.server_id is None:
        raise SystemExit("--zookeeper needs --server-id N (unique in the cluster, kept across restarts)")
    from flightstore.cluster.layout import ZkAddress
    from flightstore.cluster.member import ClusterConfig
    from flightstore.errors import InvalidInput
    try:
        return ClusterConfig(
            zookeeper=ZkAddress.parse(args.zookeeper),
            server_id=SERVER_OPTIONS["server.id"].parse(args.server_id),
            advertised_uri=args.advertised_uri or None,
            session_timeout_ms=SERVER_OPTIONS["zookeeper.session-timeout"].parse(args.zookeeper_session_timeout),
            ddl_timeout_ms=SERVER_OPTIONS["cluster.ddl-timeout"].parse(args.ddl_timeout))
    except InvalidInput as exc:
        raise SystemExit(str(exc)) from None


def _cluster(args: argparse.Namespace) -> int:
    import signal
    import threading

    from flightstore.cluster.local import LocalCluster
    from flightstore.errors import FlightstoreError
    extra = ["--zookeeper-session-timeout", args.zookeeper_session_timeout]
    cluster = LocalCluster(args.data_dir, args.servers, host=args.host, port=args.port,
                           zookeeper_port=args.zookeeper_port, extra_args=extra)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        cluster.start()
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore cluster: {exc}") from None
    print(f"zookeeper {cluster.zookeeper.address}/flightstore", flush=True)
    for server_id, server in cluster.servers.items():
        print(f"server {server_id} {server.uri}", flush=True)
    print("cluster running; Ctrl-C stops it", flush=True)
    try:
        stop.wait()
    finally:
        cluster.stop()
        print("cluster stopped", flush=True)
    return 0


def _sql(args: argparse.Namespace) -> int:
    """Run each statement, print its result as a table; on an error print the server's message
    (not a traceback) and exit 1, skipping the statements after it."""
    import pyarrow as pa

    import flightstore
    from flightstore.display import format_table
    from flightstore.errors import FlightstoreError
    name, _, password = (args.user or "").partition(":")
    try:
        with flightstore.connect(args.uri, username=name or None, password=password) as conn:
            for statement in args.statements:
                print(format_table(conn.sql(statement)), flush=True)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore sql: {_message(exc)}", file=sys.stderr)
        return 1
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


def _message(exc: BaseException) -> str:
    """The first line of a Flight error without gRPC's and pyarrow's decorations."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.split(". Detail: Python exception")[0].split(". gRPC client debug context")[0]


def _session_timeout_argument(parser: argparse.ArgumentParser) -> None:
    option = SERVER_OPTIONS["zookeeper.session-timeout"]
    parser.add_argument("--zookeeper-session-timeout", default=f"{option.default}ms", help=option.doc)


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
    serve.add_argument("--zookeeper", metavar="HOST:PORT[/chroot]", help=SERVER_OPTIONS["zookeeper.address"].doc)
    serve.add_argument("--server-id", help=SERVER_OPTIONS["server.id"].doc)
    serve.add_argument("--advertised-uri", metavar="grpc://HOST:PORT", help=SERVER_OPTIONS["advertised-uri"].doc)
    _session_timeout_argument(serve)
    serve.add_argument("--ddl-timeout", default=f'{SERVER_OPTIONS["cluster.ddl-timeout"].default}ms',
                       help=SERVER_OPTIONS["cluster.ddl-timeout"].doc)
    serve.set_defaults(func=_serve)
    cluster = commands.add_parser("cluster", help="run ZooKeeper and N servers on this machine")
    cluster.add_argument("--servers", type=int, default=3, help="number of servers (ids 1..N)")
    cluster.add_argument("--data-dir", default="./cluster-data",
                         help="holds zookeeper/ and server-<id>/ (and their logs)")
    cluster.add_argument("--host", default=SERVER_OPTIONS["host"].default, help=SERVER_OPTIONS["host"].doc)
    cluster.add_argument("--port", type=int, default=SERVER_OPTIONS["port"].default,
                         help="port of server 1; server i listens on PORT+i-1 (0: free ports)")
    cluster.add_argument("--zookeeper-port", type=int, default=0, help="ZooKeeper's port (0: a free port)")
    _session_timeout_argument(cluster)
    cluster.set_defaults(func=_cluster)
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
