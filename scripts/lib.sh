# Shared by scripts/trino.sh, scripts/postgres.sh and scripts/s3proxy.sh (sourced): messages, paths
# and stopping a process.
# The sourcing script sets SCRIPT_NAME, the prefix of its messages on stderr.

say() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}

LIB_REPO_ROOT="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# VALUE as Java's Properties.load reads it back, by the function `kimi-batch publish` writes
# Trino's catalog file with: Trino, its launcher and s3proxy read a properties file as
# ISO-8859-1 with backslash escapes, so a home folder's `ü` or `\` written raw was another path.
# Call it in an assignment, not inside a here-document, so that its failure stops the script.
java_property() {
    python3 "$LIB_REPO_ROOT/kimi_batch/storage/java_properties.py" "$1"
}

abspath() {
    # The directory may not exist yet; resolve it against the current directory without touching it.
    case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s/%s\n' "$(pwd -P)" "${1#./}" ;;
    esac
}

# `status` of a loopback server: its port (from PORT_FILE) if CHECK succeeds, else exit code 3.
print_status() {
    local check="$1" port_file="$2"
    if "$check"; then
        printf 'running on 127.0.0.1:%s\n' "$(cat "$port_file")"
    else
        printf 'not running\n'
        return 3
    fi
}

# Stops a process: SIGTERM, then SIGKILL if it is still alive after SECONDS. A JVM's shutdown
# hooks can hang (s3proxy's did, with a client's connection open), and a stop that returns with
# the server still running leaks it past the test session or the night.
stop_pid() {
    local pid="$1" seconds="$2" i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < seconds * 2; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    say "pid $pid still alive after ${seconds}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
}
