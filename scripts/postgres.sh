#!/usr/bin/env bash
# A throwaway local PostgreSQL cluster for the tests and for trying KIMI_BATCH_DATABASE_URL on one box.
#
#   scripts/postgres.sh install|start|stop|status|url
#
#   install  Debian's postgresql package (apt-get), when no initdb is found
#   start    initdb (first time) and start the cluster on 127.0.0.1; creates the kimi_batch database
#   url      print the database URL to put in KIMI_BATCH_DATABASE_URL
#
# Environment:
#   KIMI_BATCH_HOME           state directory (default ./var); the cluster lives in $KIMI_BATCH_HOME/postgres/
#                             (data/, the unix socket in run/, server.log, port)
#   KIMI_BATCH_POSTGRES_PORT  TCP port on 127.0.0.1 (default: a free one, chosen at the first start and kept)
#   KIMI_BATCH_POSTGRES_BIN   the folder of initdb/pg_ctl (default: the newest /usr/lib/postgresql/*/bin)
#
# Not a production database: it listens on loopback only with `trust` authentication for the local
# user `kimi`. PostgreSQL refuses to run as root (initdb and postgres both exit); run as root (CI,
# containers), this script starts them in a user namespace (`unshare --user`) where they are the
# unprivileged `nobody` while their files stay the caller's, so no system user or chown is needed.
set -euo pipefail

SCRIPT_NAME=postgres
# shellcheck source=scripts/lib.sh
. "$(cd -P "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

HOME_DIR="$(abspath "${KIMI_BATCH_HOME:-./var}")"
STATE="$HOME_DIR/postgres"
DATA="$STATE/data"
SOCKET_DIR="$STATE/run"
LOG="$STATE/server.log"
PORT_FILE="$STATE/port"
readonly DB_USER=kimi DB_NAME=kimi_batch

bin_dir() {
    if [[ -n "${KIMI_BATCH_POSTGRES_BIN:-}" ]]; then
        printf '%s\n' "$KIMI_BATCH_POSTGRES_BIN"
        return
    fi
    local found
    found="$(find /usr/lib/postgresql -maxdepth 3 -path '*/bin/initdb' 2>/dev/null | sort -V | tail -1)"
    [[ -n "$found" ]] && dirname "$found"
}

# PostgreSQL's programs, as an unprivileged user even when we are root (see the header).
as_postgres() {
    if [[ "$(id -u)" == 0 ]]; then
        unshare --user --map-user=65534 --map-group=65534 -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port() {
    if [[ -n "${KIMI_BATCH_POSTGRES_PORT:-}" ]]; then
        printf '%s\n' "$KIMI_BATCH_POSTGRES_PORT"
    elif [[ -f "$PORT_FILE" ]]; then
        cat "$PORT_FILE"
    else
        free_port
    fi
}

cmd_install() {
    if [[ -n "$(bin_dir)" ]]; then
        return
    fi
    say "installing postgresql (apt-get)"
    local sudo=""
    [[ "$(id -u)" == 0 ]] || sudo=sudo
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends postgresql
}

running() {
    local bin
    bin="$(bin_dir)" || return 1
    [[ -f "$DATA/postmaster.pid" ]] && as_postgres "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

cmd_start() {
    local bin port
    bin="$(bin_dir)" || die "no PostgreSQL found (initdb): run '$0 install' or set KIMI_BATCH_POSTGRES_BIN"
    [[ -n "$bin" ]] || die "no PostgreSQL found (initdb): run '$0 install' or set KIMI_BATCH_POSTGRES_BIN"
    mkdir -p "$STATE" "$SOCKET_DIR"
    chmod 700 "$STATE" "$SOCKET_DIR"
    if running; then
        say "already running on port $(cat "$PORT_FILE")"
        return
    fi
    if [[ ! -f "$DATA/PG_VERSION" ]]; then
        rm -rf "$DATA"
        as_postgres "$bin/initdb" -D "$DATA" -U "$DB_USER" --auth=trust -E UTF8 --locale=C.UTF-8 \
            >"$STATE/initdb.log" 2>&1 || die "initdb failed: see $STATE/initdb.log"
    fi
    port="$(port)"
    [[ "$port" =~ ^[0-9]+$ ]] || die "KIMI_BATCH_POSTGRES_PORT must be a number, got '$port'"
    printf '%s\n' "$port" >"$PORT_FILE"
    as_postgres "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $SOCKET_DIR -c max_connections=200" \
        >/dev/null || die "the server did not start: see $LOG"
    if ! as_postgres "$bin/psql" -h "$SOCKET_DIR" -p "$port" -U "$DB_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" | grep -q 1; then
        as_postgres "$bin/createdb" -h "$SOCKET_DIR" -p "$port" -U "$DB_USER" "$DB_NAME"
    fi
    say "running on 127.0.0.1:$port ($(cmd_url))"
}

cmd_stop() {
    local bin
    bin="$(bin_dir)" || return 0
    if running; then
        as_postgres "$bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
        say "stopped"
    fi
}

cmd_status() { print_status running "$PORT_FILE"; }

cmd_url() {
    [[ -f "$PORT_FILE" ]] || die "not started: run '$0 start'"
    printf 'postgresql://%s@127.0.0.1:%s/%s\n' "$DB_USER" "$(cat "$PORT_FILE")" "$DB_NAME"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) cmd_url ;;
*)
    printf 'usage: %s install|start|stop|status|url\n' "$0" >&2
    exit 2
    ;;
esac
