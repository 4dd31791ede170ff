#!/usr/bin/env bash
# A throw-away PostgreSQL server for the tests (`.ci/run`'s PostgreSQL run), from Debian's
# `postgresql` package: its own cluster in DIR (run as the `postgres` user, as initdb demands),
# listening on 127.0.0.1 only, with a `playground` role that may create databases (pytest-django
# and the live stack each create their own).
#
#   env=$(scripts/test_postgres.sh start DIR [PORT]) && eval "$env"   # exports DATABASE_URL
#   scripts/test_postgres.sh stop DIR
# (Not `eval "$(... start ...)"`: that hides a failed start, and the tests would then run on the
# default SQLite database.)
set -euo pipefail

action=${1:?usage: $0 start|stop DIR [PORT]}
dir=${2:?usage: $0 start|stop DIR [PORT]}
port=${3:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_postgres=(setpriv --reuid=postgres --regid=postgres --init-groups)

case "$action" in
start)
    [[ -x "$bin/postgres" ]] || { echo "no PostgreSQL server: apt-get install postgresql" >&2; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir/run" && chown -R postgres:postgres "$dir"
    "${as_postgres[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >"$dir/initdb.log"
    "${as_postgres[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir/run -c fsync=off -c max_connections=200" >&2
    psql=("${as_postgres[@]}" "$bin/psql" -h "$dir/run" -p "$port" -U postgres -q -v ON_ERROR_STOP=1)
    "${psql[@]}" -c "CREATE ROLE playground LOGIN CREATEDB PASSWORD 'playground'"
    "${psql[@]}" -c "CREATE DATABASE playground OWNER playground"
    echo "export DATABASE_URL=postgres://playground:playground@127.0.0.1:$port/playground"
    ;;
stop)
    [[ -d "$dir/data" ]] && "${as_postgres[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop DIR [PORT]" >&2
    exit 2
    ;;
esac
