"""The ``flightstore`` command line: ``serve``, ``cluster``, ``sql``, ``snapshot``, ``user``,
``lake status``, ``verify``, ``repair``, ``options``.

Passwords never appear on a command line (where ``ps`` and shell history would show them): ``user
add`` and ``sql --user`` read them from the ``FLIGHTSTORE_PASSWORD`` environment variable, from
standard input (``--password-stdin``) or from a prompt.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys

from flightstore.config import SERVER_OPTIONS, options_markdown, options_page

__all__ = ["main"]


PASSWORD_ENV = "FLIGHTSTORE_PASSWORD"


def _options(specs: list[str] | None) -> dict[str, str]:
    """``--option KEY=VALUE`` arguments as a dict."""
    options = {}
    for spec in specs or []:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--option expects KEY=VALUE, got {spec!r}")
        options[key.strip()] = value.strip()
    return options


def _serve(args: argparse.Namespace) -> int:
    from flightstore.errors import FlightstoreError
    from flightstore.server.service import serve
    from flightstore.server.tls import TlsConfig
    from flightstore.server.users import UserStore
    options = _options(args.option)

    def flag_or_option(flag: str | None, key: str) -> str | None:
        """A flag, else the same setting given as ``--option key=value`` (never ignored)."""
        return flag if flag is not None else options.get(key)

    try:
        users_file = flag_or_option(args.users_file, "auth.users-file")
        users = UserStore.open(users_file) if users_file else None
        tls_cert, tls_key = flag_or_option(args.tls_cert, "tls.cert"), flag_or_option(args.tls_key, "tls.key")
        tls_client_ca = flag_or_option(args.tls_client_ca, "tls.client-ca")
        tls_root = flag_or_option(args.tls_root, "tls.root")
        if (tls_cert is None) != (tls_key is None):
            raise SystemExit("--tls-cert and --tls-key go together")
        if tls_client_ca and not tls_cert:
            raise SystemExit("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if tls_root and not (tls_cert and args.zookeeper):
            raise SystemExit("--tls-root (the CA of a cluster's servers) needs --tls-cert, --tls-key and --zookeeper")
        tls = TlsConfig.from_files(tls_cert, tls_key, tls_client_ca, tls_root) if tls_cert else None
        super_users = SERVER_OPTIONS["authorizer.super-users"].parse(
            ",".join(args.super_user) if args.super_user else options.get("authorizer.super-users", ""))
        if super_users and users is None and not args.zookeeper:
            raise SystemExit("--super-user needs --users-file (without users everyone is a super user)")
        token_ttl = flag_or_option(args.token_ttl, "auth.token-ttl")
        token_ttl_ms = SERVER_OPTIONS["auth.token-ttl"].parse(token_ttl) if token_ttl is not None else None
        max_tokens = flag_or_option(args.max_tokens, "auth.max-tokens")
        max_tokens = SERVER_OPTIONS["auth.max-tokens"].parse(max_tokens) if max_tokens is not None else None
        metrics_port = flag_or_option(args.metrics_port, "metrics.port")
        metrics_port = SERVER_OPTIONS["metrics.port"].parse(metrics_port) if metrics_port is not None else None
        if args.console_port is not None:  # the flag wins over --option console.port (checked as one)
            options["console.port"] = args.console_port
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore: {exc}") from None
    cluster = _cluster_config(args, flag_or_option(args.cluster_secret_file, "cluster.secret-file"))
    serve(args.data_dir, host=args.host, port=args.port, fsync=args.fsync, users=users,
          cluster=cluster, super_users=super_users, tls=tls, token_ttl_ms=token_ttl_ms,
          max_tokens=max_tokens, metrics_port=metrics_port, options=options,
          workers=_workers(args, options, cluster, tls, metrics_port))
    _exit_after_clean_stop()
    return 0  # not reached


def _exit_after_clean_stop() -> None:
    """End ``serve`` once the server stopped cleanly, without the interpreter's finalization:
    ``serve`` closed everything it holds (store, lake, ZooKeeper session, listeners, workers), and
    tearing down pyarrow, gRPC and DuckDB took another 0.5-2 s after "flightstore stopped" on a
    busy machine, holding up every restart (a rolling upgrade, a test stopping its server). Logs and
    output are flushed first; the exit code is 0, as before."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _workers(args: argparse.Namespace, options: dict[str, str], cluster, tls, metrics_port: int | None):
    """The WorkerLaunch of ``serve --workers N`` (N > 1), or of a worker worker 0 started; None
    for one server process."""
    from flightstore.errors import FlightstoreError
    try:
        count = SERVER_OPTIONS["server.workers"].parse(
            args.workers if args.workers is not None else options.get("server.workers", "1"))
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore: {exc}") from None
    if args.worker_of is None and args.worker_id is not None:
        raise SystemExit("--worker-id is set by worker 0 for the workers it starts")
    if count == 1 and args.worker_of is None:
        return None
    if cluster is not None:
        raise SystemExit("--workers runs a group of processes on one machine without ZooKeeper; "
                         "in a cluster run one server per core with --zookeeper instead")
    if tls is not None:
        raise SystemExit("--workers with TLS is not supported yet: the calls between workers do not "
                         "verify certificates")
    lake = sorted(key for key in options if key.startswith("datalake."))
    if lake:
        raise SystemExit(f"--workers does not tier into a lake yet (as a cluster): drop {', '.join(lake)}")
    from flightstore.cluster.workers.launch import WorkerLaunch
    if args.worker_of is not None:
        worker_id = SERVER_OPTIONS["server.id"].parse(args.worker_id or "0")
        if not 0 < worker_id < count:
            raise SystemExit(f"--worker-id {worker_id} is not a worker of {count}")
        return WorkerLaunch(count, worker_id, args.worker_of)
    shared = ["--host", args.host, "--fsync" if args.fsync else "--no-fsync"]
    if args.users_file or options.get("auth.users-file"):
        shared += ["--users-file", args.users_file or options["auth.users-file"]]
    for name in args.super_user or []:
        shared += ["--super-user", name]
    for flag, value in (("--token-ttl", args.token_ttl), ("--max-tokens", args.max_tokens)):
        if value is not None:
            shared += [flag, value]
    for key, value in options.items():
        if key not in ("server.workers", "metrics.port", "console.port", "auth.users-file"):
            shared += ["--option", f"{key}={value}"]
    return WorkerLaunch(count, 0, None, tuple(shared), metrics_port)


def _lake_status(args: argparse.Namespace) -> int:
    """Print the tiering status of every bucket (tab-separated), one line per bucket."""
    import time

    import pyarrow as pa

    import flightstore
    from flightstore.errors import FlightstoreError
    password = _password(args, confirm=False) if args.user else None
    try:
        with flightstore.connect(args.uri, username=args.user, password=password, timeout=60) as conn:
            tables = conn.lake_status(args.table)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore lake status: {_message(exc)}", file=sys.stderr)
        return 1
    print("table\tbucket\ttiered_offset\tlog_end_offset\tlag_records\tlag_seconds\tlast_commit\tlast_error"
          "\tdamaged_files")
    for table in tables:
        commit = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(table["last_commit_ms"] / 1000))
                  if table["last_commit_ms"] else "-")
        for bucket in table["buckets"]:
            tiered = "-" if bucket["tiered_offset"] is None else bucket["tiered_offset"]
            print(f"{table['table']}\t{bucket['bucket']}\t{tiered}\t{bucket['log_end_offset']}\t"
                  f"{bucket['lag_records']}\t{bucket['lag_seconds']:.1f}\t{commit}\t"
                  f"{table['last_error'] or '-'}\t{'; '.join(bucket.get('damaged_files') or []) or '-'}")
    return 0


def _password(args: argparse.Namespace, confirm: bool) -> str:
    """The password from $FLIGHTSTORE_PASSWORD, stdin (--password-stdin) or a prompt."""
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if getattr(args, "password_stdin", False) or not sys.stdin.isatty():
        line = sys.stdin.readline()
        return line.removesuffix("\n")
    password = getpass.getpass("password: ")
    if confirm and getpass.getpass("again: ") != password:
        raise SystemExit("the passwords differ")
    return password


def _user(args: argparse.Namespace) -> int:
    from flightstore.errors import FlightstoreError
    from flightstore.server.users import UserStore
    if (args.users_file is None) == (args.zookeeper is None):
        raise SystemExit("flightstore user: give --users-file FILE (one server) or --zookeeper HOST:PORT[/chroot] "
                         "(a cluster)")
    if args.zookeeper:
        return _cluster_user(args)
    try:
        users = UserStore.open(args.users_file, create=args.action == "add")
        if args.action == "add":
            users.add(args.name, _password(args, confirm=True), replace=args.replace)
            print(f"user {args.name} {'updated' if args.replace else 'added'} in {args.users_file}")
        elif args.action == "remove":
            users.remove(args.name)
            print(f"user {args.name} removed from {args.users_file}")
        else:
            for name in users.names():
                print(name)
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore user: {exc}") from None
    return 0


def _cluster_user(args: argparse.Namespace) -> int:
    """``flightstore user ... --zookeeper``: the cluster's users, changed in ZooKeeper; returns
    once every live server applied the change."""
    from flightstore.cluster.security import zookeeper_users
    from flightstore.errors import FlightstoreError
    where = f"the cluster at {args.zookeeper}"
    try:
        if args.action == "list":
            for name in zookeeper_users(args.zookeeper, "list"):
                print(name)
            return 0
        password = _password(args, confirm=True) if args.action == "add" else None
        zookeeper_users(args.zookeeper, args.action, args.name, password, replace=args.replace)
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore user: {exc}") from None
    verb = {"add": "updated" if args.replace else "added", "remove": "removed"}[args.action]
    print(f"user {args.name} {verb} in {where}")
    return 0


def _cluster_config(args: argparse.Namespace, secret_file: str | None = None):
    """The ClusterConfig of ``serve --zookeeper ...``; None for a single server."""
    if not args.zookeeper:
        if args.server_id is not None or args.advertised_uri:
            raise SystemExit("--server-id and --advertised-uri need --zookeeper")
        if secret_file:
            raise SystemExit("--cluster-secret-file needs --zookeeper")
        return None
    if args.server_id is None:
        raise SystemExit("--zookeeper needs --server-id N (unique in the cluster, kept across restarts)")
    from flightstore.cluster.layout import ZkAddress
    from flightstore.cluster.member import ClusterConfig
    from flightstore.cluster.security import read_secret_file
    from flightstore.errors import InvalidInput
    try:
        return ClusterConfig(
            secret_key=read_secret_file(secret_file) if secret_file else None,
            zookeeper=ZkAddress.parse(args.zookeeper),
            server_id=SERVER_OPTIONS["server.id"].parse(args.server_id),
            advertised_uri=args.advertised_uri or None,
            session_timeout_ms=SERVER_OPTIONS["zookeeper.session-timeout"].parse(args.zookeeper_session_timeout),
            ddl_timeout_ms=SERVER_OPTIONS["cluster.ddl-timeout"].parse(args.ddl_timeout))
    except InvalidInput as exc:
        raise SystemExit(str(exc)) from None


def _cluster(args: argparse.Namespace) -> int:
    if args.action != "run":
        from flightstore.cluster.admin import decommission, status
        password = _password(args, confirm=False) if args.user else None
        if args.action == "status":
            return status(args.uri, args.table, username=args.user, password=password)
        if args.server_id is None:
            raise SystemExit("flightstore cluster decommission needs --server-id N")
        return decommission(args.uri, args.server_id, args.timeout, username=args.user, password=password)
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
    from flightstore.display import SHOWN_ROWS, format_table
    from flightstore.errors import FlightstoreError
    from flightstore.progress import progress
    password = _password(args, confirm=False) if args.user else None
    try:
        with flightstore.connect(args.uri, username=args.user, password=password,
                                 tls_root_certs=args.tls_root_certs) as conn:
            for statement in args.statements:
                with progress(" ".join(statement.split())[:40], unit="rows") as steps:
                    shown, total = _first_rows(conn.sql_batches(statement), SHOWN_ROWS, steps)
                print(format_table(shown, total_rows=total), flush=True)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore sql: {_message(exc)}", file=sys.stderr)
        return 1
    return 0


def _first_rows(batches, keep: int, steps) -> tuple:
    """The first ``keep`` rows of a result (a table) and its row count, reading it batch by batch:
    a large result is counted, never held, and ``steps`` hears of the rows as they arrive."""
    import pyarrow as pa
    kept, held, total = [], 0, 0
    for batch in batches:
        if held < keep:
            kept.append(batch.slice(0, keep - held))
            held += kept[-1].num_rows
        total += batch.num_rows
        steps.advance(batch.num_rows)
    return pa.Table.from_batches(kept, schema=batches.schema), total


def _verify(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is lost or unreadable, 1 when something is, 2 when it cannot run."""
    from flightstore.errors import DataDirectoryInUse
    from flightstore.maintenance import verify
    from flightstore.progress import progress
    try:
        with progress("verify", unit="buckets") as steps:
            report = verify(args.data_dir, _options(args.option), steps)
    except DataDirectoryInUse as exc:
        print(f"flightstore verify: {exc}", file=sys.stderr)
        return 2
    return _print_report("verify", report)


def _repair(args: argparse.Namespace) -> int:
    """Exit 0 when every table opens and reads again, 1 otherwise, 2 when it cannot run."""
    from flightstore.errors import FlightstoreError
    from flightstore.maintenance import repair
    from flightstore.progress import progress
    try:
        with progress("repair", unit="steps") as steps:
            report = repair(args.data_dir, args.table or None, fsync=args.fsync, steps=steps)
    except FlightstoreError as exc:
        print(f"flightstore repair: {exc}", file=sys.stderr)
        return 2
    return _print_report("repair", report)


def _print_report(command: str, report) -> int:
    for finding in report.findings:
        print(finding)
    print(f"flightstore {command}: {report.summary()}")
    return 0 if report.ok else 1


def _snapshot(args: argparse.Namespace) -> int:
    """Take KV snapshots now: through a running server (``--uri``) or, with the server stopped,
    directly in ``--data-dir``. Prints one line per bucket; on an error prints the message and
    exits 1."""
    import pyarrow as pa

    import flightstore
    from flightstore.errors import FlightstoreError
    try:
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
        password = _password(args, confirm=False) if args.user else None
        with flightstore.connect(args.uri, username=args.user, password=password,
                                 tls_root_certs=args.tls_root_certs) as conn:
            for name in args.tables:
                for bucket, info in conn.table(name).snapshot(force=args.force).items():
                    _print_snapshot(name, bucket, info)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore snapshot: {_message(exc)}", file=sys.stderr)
        return 1
    return 0


def _print_snapshot(table: str, bucket: int, info: dict | None) -> None:
    if info is None:
        print(f"{table} bucket {bucket}: empty, no snapshot", flush=True)
    else:
        print(f"{table} bucket {bucket}: snapshot {info['id']} at log offset {info['offset']} "
              f"({info['rows']} rows)", flush=True)


def _message(exc: BaseException) -> str:
    """The first line of a Flight error without gRPC's and pyarrow's decorations."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.split(". Detail: Python exception")[0].split(". gRPC client debug context")[0]


def _help(option) -> str:
    """An option's documentation as argparse help: argparse expands ``%`` in help texts."""
    return option.doc.replace("%", "%%")


def _session_timeout_argument(parser: argparse.ArgumentParser) -> None:
    option = SERVER_OPTIONS["zookeeper.session-timeout"]
    parser.add_argument("--zookeeper-session-timeout", default=f"{option.default}ms", help=_help(option))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flightstore", description="Streaming storage over Arrow Flight SQL")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the Flight SQL server", allow_abbrev=False)
    serve.add_argument("--data-dir", default=SERVER_OPTIONS["data-dir"].default,
                       help=_help(SERVER_OPTIONS["data-dir"]))
    serve.add_argument("--host", default=SERVER_OPTIONS["host"].default, help=_help(SERVER_OPTIONS["host"]))
    serve.add_argument("--port", type=int, default=SERVER_OPTIONS["port"].default,
                       help=_help(SERVER_OPTIONS["port"]))
    serve.add_argument("--fsync", action=argparse.BooleanOptionalAction,
                       default=SERVER_OPTIONS["log.fsync"].default, help=_help(SERVER_OPTIONS["log.fsync"]))
    serve.add_argument("--users-file", metavar="FILE", help=_help(SERVER_OPTIONS["auth.users-file"]))
    serve.add_argument("--super-user", action="append", metavar="NAME",
                       help=_help(SERVER_OPTIONS["authorizer.super-users"]) + " Repeat for several.")
    serve.add_argument("--token-ttl", help=_help(SERVER_OPTIONS["auth.token-ttl"]) +
                       f' Default: {SERVER_OPTIONS["auth.token-ttl"].default} ms.')
    serve.add_argument("--max-tokens", help=_help(SERVER_OPTIONS["auth.max-tokens"]) +
                       f' Default: {SERVER_OPTIONS["auth.max-tokens"].default}.')
    serve.add_argument("--tls-cert", metavar="PEM", help=_help(SERVER_OPTIONS["tls.cert"]))
    serve.add_argument("--tls-key", metavar="PEM", help=_help(SERVER_OPTIONS["tls.key"]))
    serve.add_argument("--tls-client-ca", metavar="PEM", help=_help(SERVER_OPTIONS["tls.client-ca"]))
    serve.add_argument("--tls-root", metavar="PEM", help=_help(SERVER_OPTIONS["tls.root"]))
    serve.add_argument("--metrics-port", help=_help(SERVER_OPTIONS["metrics.port"]))
    serve.add_argument("--console-port", help=_help(SERVER_OPTIONS["console.port"]))
    serve.add_argument("--option", "-o", action="append", metavar="KEY=VALUE",
                       help="any server option of `flightstore options` (repeatable), e.g. "
                            "-o max.partition.num=100 or -o datalake.iceberg.warehouse=s3://bucket/lake")
    serve.add_argument("--workers", metavar="N", help=_help(SERVER_OPTIONS["server.workers"]))
    serve.add_argument("--worker-id", help=argparse.SUPPRESS)  # set by worker 0 for its children
    serve.add_argument("--worker-of", metavar="URI", help=argparse.SUPPRESS)
    serve.add_argument("--zookeeper", metavar="HOST:PORT[/chroot]", help=_help(SERVER_OPTIONS["zookeeper.address"]))
    serve.add_argument("--server-id", help=_help(SERVER_OPTIONS["server.id"]))
    serve.add_argument("--advertised-uri", metavar="grpc://HOST:PORT", help=_help(SERVER_OPTIONS["advertised-uri"]))
    serve.add_argument("--cluster-secret-file", metavar="FILE", help=_help(SERVER_OPTIONS["cluster.secret-file"]))
    _session_timeout_argument(serve)
    serve.add_argument("--ddl-timeout", default=f'{SERVER_OPTIONS["cluster.ddl-timeout"].default}ms',
                       help=_help(SERVER_OPTIONS["cluster.ddl-timeout"]))
    serve.set_defaults(func=_serve)
    cluster = commands.add_parser(
        "cluster", help="`cluster [run]`: ZooKeeper and N servers on this machine; `cluster status`: "
        "leaders, in-sync replicas and lag per bucket; `cluster decommission --server-id N`: move a "
        "server's replicas away, then let it stop")
    cluster.add_argument("action", nargs="?", choices=("run", "status", "decommission"), default="run")
    cluster.add_argument("--uri", default="grpc://127.0.0.1:8815",
                         help="status, decommission: any server of the cluster")
    cluster.add_argument("--server-id", type=int, help="decommission: the server whose replicas move away")
    cluster.add_argument("--user", metavar="NAME",
                         help=f"status, decommission: authenticate as NAME (password from ${PASSWORD_ENV})")
    cluster.add_argument("--table", help="status: only this table (db.table)")
    cluster.add_argument("--timeout", type=float, default=600.0,
                         help="decommission: seconds to wait for the replicas to move (default 600)")
    cluster.add_argument("--servers", type=int, default=3, help="number of servers (ids 1..N)")
    cluster.add_argument("--data-dir", default="./cluster-data",
                         help="holds zookeeper/ and server-<id>/ (and their logs)")
    cluster.add_argument("--host", default=SERVER_OPTIONS["host"].default, help=_help(SERVER_OPTIONS["host"]))
    cluster.add_argument("--port", type=int, default=SERVER_OPTIONS["port"].default,
                         help="port of server 1; server i listens on PORT+i-1 (0: free ports)")
    cluster.add_argument("--zookeeper-port", type=int, default=0, help="ZooKeeper's port (0: a free port)")
    _session_timeout_argument(cluster)
    cluster.set_defaults(func=_cluster)
    sql = commands.add_parser("sql", help="run SQL statements against a server")
    sql.add_argument("--uri", default="grpc://127.0.0.1:8815")
    sql.add_argument("--user", metavar="NAME", help=f"authenticate as NAME (password from ${PASSWORD_ENV}, "
                     "stdin or a prompt)")
    sql.add_argument("--tls-root-certs", metavar="PEM", help="CA certificates to verify a grpc+tls:// server")
    sql.add_argument("statements", nargs="+")
    sql.set_defaults(func=_sql)
    snapshot = commands.add_parser("snapshot", help="take KV snapshots of primary-key tables now")
    snapshot.add_argument("--uri", default="grpc://127.0.0.1:8815", help="the server to ask")
    snapshot.add_argument("--data-dir", help="work on this data directory directly (server stopped)")
    snapshot.add_argument("--user", metavar="NAME",
                          help=f"authenticate as NAME (password from ${PASSWORD_ENV}, stdin or a prompt)")
    snapshot.add_argument("--tls-root-certs", metavar="PEM",
                          help="CA certificates to verify a grpc+tls:// server")
    snapshot.add_argument("--force", action="store_true", help="even if a bucket did not change")
    snapshot.add_argument("tables", nargs="+", metavar="TABLE", help="db.table")
    snapshot.set_defaults(func=_snapshot)
    lake = commands.add_parser("lake", help="the lake tier: `lake status [TABLE]`")
    lake_commands = lake.add_subparsers(dest="lake_command", required=True)
    status = lake_commands.add_parser("status", help="tiering lag per table and bucket, last commit, "
                                                     "last error")
    status.add_argument("--uri", default="grpc://127.0.0.1:8815")
    status.add_argument("--user", metavar="NAME",
                        help=f"authenticate as NAME (password from ${PASSWORD_ENV}, stdin or a prompt)")
    status.add_argument("table", nargs="?", help="database.table (default: every datalake-enabled table)")
    status.set_defaults(func=_lake_status)
    user = commands.add_parser("user", help="manage users (salted Argon2id password hashes): a server's users "
                                            "file, or a cluster's users in ZooKeeper")
    user.add_argument("action", choices=("add", "remove", "list"))
    user.add_argument("name", nargs="?", help="the user (add, remove)")
    user.add_argument("--users-file", metavar="FILE", help="the users file (serve --users-file)")
    user.add_argument("--zookeeper", metavar="HOST:PORT[/chroot]",
                      help="the cluster's users (serve --zookeeper); a change returns once every live server "
                           "applied it")
    user.add_argument("--password-stdin", action="store_true",
                      help=f"read the password from standard input (else ${PASSWORD_ENV} or a prompt)")
    user.add_argument("--replace", action="store_true", help="set a new password for an existing user")
    user.set_defaults(func=_user)
    verify = commands.add_parser("verify", help="check every CRC, checksum and KV block of a data "
                                 "directory and its lake files and report, changing nothing (exit 1 if "
                                 "data is lost)")
    verify.add_argument("data_dir", metavar="DATA_DIR")
    verify.add_argument("--option", "-o", action="append", metavar="KEY=VALUE",
                        help="a server option saying where the lake is (datalake.iceberg.*), as for serve")
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
    options.add_argument("--page", action="store_true", help="the whole page docs/options.md")
    options.set_defaults(func=lambda a: print(options_page() if a.page else options_markdown(), end="\n"
                                              if not a.page else "") or 0)
    args = parser.parse_args(argv)
    if args.command == "user" and args.action != "list" and not args.name:
        parser.error(f"user {args.action} needs a NAME")
    sys.exit(args.func(args))
