#!/usr/bin/env bash
# A throwaway local S3-compatible server (s3proxy, Apache-2.0) for the tests of an s3:// warehouse.
#
#   scripts/s3proxy.sh fetch|start|config|stop|status|env
#
#   fetch   s3proxy's jar from Maven Central (org.gaul:s3proxy, jar-with-dependencies), cached in
#           ${XDG_CACHE_HOME:-$HOME/.cache}/kimi_batch
#   start   serve $KIMI_BATCH_HOME/s3proxy/data (one folder per bucket) on 127.0.0.1, bucket
#           `kimi-batch` created; the access key and its secret are made at the first start (0600)
#   config  write $KIMI_BATCH_HOME/s3proxy/s3proxy.conf as `start` does, and start nothing
#   env     print the variables a client needs (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#           AWS_REGION, KIMI_BATCH_S3_ENDPOINT), one NAME=value a line, for `export`
#
# Environment:
#   KIMI_BATCH_HOME          state directory (default ./var); the server lives in $KIMI_BATCH_HOME/s3proxy/
#   KIMI_BATCH_S3PROXY_PORT  TCP port on 127.0.0.1 (default: a free one, chosen at the first start and kept)
#   JAVA_HOME                a Java >= 17; else the newest /usr/lib/jvm/*, then `java` on PATH
#
# Not a production store: s3proxy's filesystem backend is strongly consistent (a read after a
# write sees it, a listing is current), has one identity and no IAM policies, and keeps each
# object as one file (multipart uploads are assembled locally).
set -euo pipefail

readonly S3PROXY_VERSION=4.1.0
SCRIPT_NAME=s3proxy
# shellcheck source=scripts/lib.sh
. "$(cd -P "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

HOME_DIR="$(abspath "${KIMI_BATCH_HOME:-./var}")"
CACHE_DIR="$(abspath "${XDG_CACHE_HOME:-$HOME/.cache}/kimi_batch")"
JAR="$CACHE_DIR/s3proxy-$S3PROXY_VERSION.jar"
STATE="$HOME_DIR/s3proxy"
DATA="$STATE/data"
PORT_FILE="$STATE/port"
PID_FILE="$STATE/s3proxy.pid"
SECRET_FILE="$STATE/secret"
readonly ACCESS_KEY=kimi BUCKET=kimi-batch REGION=us-east-1

java_bin() {
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        printf '%s\n' "$JAVA_HOME/bin/java"
        return
    fi
    local found
    found="$(find /usr/lib/jvm -maxdepth 3 -path '*/bin/java' 2>/dev/null | sort -V | tail -1)"
    if [[ -n "$found" ]]; then
        printf '%s\n' "$found"
    else
        command -v java || die "no Java found: install a JDK >= 17 or set JAVA_HOME"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_fetch() {
    [[ -f "$JAR" ]] && return 0
    mkdir -p "$CACHE_DIR"
    local repo="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"
    local fetched="$repo/org/gaul/s3proxy/$S3PROXY_VERSION/s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar"
    if [[ ! -f "$fetched" ]]; then
        command -v mvn >/dev/null || die "mvn is needed to fetch s3proxy $S3PROXY_VERSION from Maven Central"
        say "fetching org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies (~55 MB) from Maven Central"
        mvn -q dependency:get -Dartifact="org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies" \
            -Dtransitive=false ${MAVEN_REPO_LOCAL:+-Dmaven.repo.local="$MAVEN_REPO_LOCAL"} >&2
        [[ -f "$fetched" ]] || die "mvn finished but $fetched is missing"
    fi
    cp "$fetched" "$JAR.tmp.$$" && mv "$JAR.tmp.$$" "$JAR"
}

# The pid file's process is this s3proxy. A pid file left by a server that died, or from before a
# reboot, may name an unrelated process by now: `stop` killed it, and `start` took it for the
# server and started none.
running() {
    local pid cmdline
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 0
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    [[ "$cmdline" == *"-jar $JAR "* ]]
}

# The server's properties file (its port and secret made at the first call), nothing started.
write_config() {
    mkdir -p "$STATE" "$DATA/$BUCKET"
    chmod 700 "$STATE"
    local port
    if [[ -f "$PORT_FILE" ]]; then
        port="$(cat "$PORT_FILE")"
    else
        port="${KIMI_BATCH_S3PROXY_PORT:-$(free_port)}"
    fi
    [[ "$port" =~ ^[0-9]+$ ]] || die "KIMI_BATCH_S3PROXY_PORT must be a number, got '$port'"
    printf '%s\n' "$port" >"$PORT_FILE"
    if [[ ! -f "$SECRET_FILE" ]]; then
        (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(20))' >"$SECRET_FILE")
    fi
    local basedir
    basedir="$(java_property "$DATA")"
    # The secret is in a 0600 file, never on a command line. The folder is escaped as Java reads
    # it (s3proxy reads the file with Properties.load); the other values are ASCII by make. Unknown headers are ignored, not
    # refused: Trino's listings ask for x-amz-optional-object-attributes (a Glacier object's
    # restore status), which s3proxy does not implement and a filesystem store never needs.
    (umask 077 && cat >"$STATE/s3proxy.conf" <<CONF
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.ignore-unknown-headers=true
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$ACCESS_KEY
s3proxy.credential=$(cat "$SECRET_FILE")
jclouds.provider=filesystem
jclouds.filesystem.basedir=$basedir
CONF
)
}

cmd_start() {
    if running; then
        say "already running on port $(cat "$PORT_FILE")"
        return
    fi
    cmd_fetch
    write_config
    local port
    port="$(cat "$PORT_FILE")"
    nohup "$(java_bin)" -Xmx256m -jar "$JAR" --properties "$STATE/s3proxy.conf" \
        >"$STATE/server.log" 2>&1 </dev/null &
    local pid=$!
    printf '%s\n' "$pid" >"$PID_FILE"
    local waited=0
    until curl -s -o /dev/null "http://127.0.0.1:$port/"; do
        # The pid just started is ours (`running` would read the command line of the shell that
        # forked it, for the moment before `nohup` runs).
        kill -0 "$pid" 2>/dev/null || die "s3proxy exited: see $STATE/server.log"
        ((waited++ < 60)) || die "s3proxy did not answer within 30 s: see $STATE/server.log"
        sleep 0.5
    done
    say "running on 127.0.0.1:$port (bucket $BUCKET)"
}

cmd_stop() {
    if running; then
        stop_pid "$(cat "$PID_FILE")" 10
        say "stopped"
    fi
    rm -f "$PID_FILE"
}

cmd_status() { print_status running "$PORT_FILE"; }

cmd_env() {
    [[ -f "$PORT_FILE" && -f "$SECRET_FILE" ]] || die "not started: run '$0 start'"
    printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\nAWS_REGION=%s\n' \
        "$ACCESS_KEY" "$(cat "$SECRET_FILE")" "$REGION"
    printf 'KIMI_BATCH_S3_ENDPOINT=http://127.0.0.1:%s\n' "$(cat "$PORT_FILE")"
}

case "${1:-}" in
fetch) cmd_fetch ;;
start) cmd_start ;;
config) write_config && say "wrote $STATE/s3proxy.conf" ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) cmd_env ;;
*)
    printf 'usage: %s fetch|start|config|stop|status|env\n' "$0" >&2
    exit 2
    ;;
esac
