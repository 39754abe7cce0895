# Shared by scripts/trino.sh and scripts/postgres.sh (sourced): messages and paths.
# The sourcing script sets SCRIPT_NAME, the prefix of its messages on stderr.

say() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}

abspath() {
    # The directory may not exist yet; resolve it against the current directory without touching it.
    case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s/%s\n' "$(pwd -P)" "${1#./}" ;;
    esac
}
