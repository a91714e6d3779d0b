#!/usr/bin/env bash
# A throwaway local PostgreSQL for the server benchmark (the PK-lookup peer).
#
#   bench/setup_postgres.sh start DIR   -> installs Debian's postgresql if missing, initdb's a cluster
#                                          in DIR as the postgres user, starts it on a free loopback
#                                          port and prints "URI=postgresql://postgres@127.0.0.1:PORT/postgres"
#   bench/setup_postgres.sh stop DIR    -> stops that cluster (DIR is left for the caller to remove)
#
# The benchmark loads the rows itself (adbc_ingest through adbc-driver-postgresql), so both systems
# hold exactly the same table. Trust auth, loopback only, fsync off: a benchmark peer, not a service.
set -euo pipefail

cmd="${1:?usage: setup_postgres.sh start|stop DIR}"
dir="${2:?usage: setup_postgres.sh start|stop DIR}"

find_bin() {
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "$cmd" in
start)
    bin=$(find_bin || true)
    if [ -z "$bin" ]; then
        if [ "$(id -u)" != 0 ]; then
            echo "postgresql is not installed and this user cannot apt-get install it" >&2
            exit 2
        fi
        echo "installing postgresql with apt-get ..." >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq postgresql >&2
        bin=$(find_bin || true)
        [ -n "$bin" ] || { echo "postgresql installed but no initdb found" >&2; exit 2; }
    fi
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
        # runuser needs to traverse the parents of DIR
        p="$dir"; while [ "$p" != "/" ]; do p=$(dirname "$p"); chmod o+x "$p" 2>/dev/null || true; done
    fi
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_postgres "$bin/initdb" -D "$dir/pgdata" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 3; }
    as_postgres "$bin/pg_ctl" -D "$dir/pgdata" -l "$dir/server.log" -w -t 60 \
        -o "-p $port -h 127.0.0.1 -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=256MB" \
        start >&2 || { cat "$dir/server.log" >&2; exit 4; }
    echo "URI=postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    bin=$(find_bin)
    as_postgres "$bin/pg_ctl" -D "$dir/pgdata" -m fast -w stop >&2 || true
    ;;
*)
    echo "usage: setup_postgres.sh start|stop DIR" >&2
    exit 1
    ;;
esac
