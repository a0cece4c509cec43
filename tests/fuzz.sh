#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time.
#
#   tests/fuzz.sh [SECONDS]        # SECONDS per target, default 20
#
# Environment:
#   FUZZ_TARGETS    targets to run (default: every target in fuzz/fuzz_targets)
#   FUZZ_SANITIZER  address (default) or none; falls back to none when the
#                   toolchain cannot build with AddressSanitizer
#   FUZZ_KEEP       a directory to keep the grown corpora in (default: a temporary
#                   directory that is removed)
#
# Each run starts from the committed seeds (fuzz/seeds/<target>/), copied into a
# scratch corpus, so what the fuzzer adds is never committed by accident. A crash
# is saved under fuzz/artifacts/<target>/; reproduce it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/crash-...
# (from the repository root) and turn it into a unit test in the module at fault.
# Works on the stable toolchain: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags.
set -euo pipefail

secs="${1:-20}"
case "$secs" in
    '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi

targets="${FUZZ_TARGETS:-$(cd fuzz/fuzz_targets && ls -- *.rs | sed 's/\.rs$//' | tr '\n' ' ')}"
sanitizer="${FUZZ_SANITIZER:-address}"

# `cargo fuzz build` takes one target at a time.
build() {
    local t
    for t in $targets; do
        cargo fuzz build --sanitizer "$1" "$t" || return 1
    done
}
start=$(date +%s)
if ! build "$sanitizer"; then
    if [ "$sanitizer" = none ]; then
        echo "fuzz.sh: cargo fuzz build failed" >&2
        exit 1
    fi
    echo "fuzz.sh: building with --sanitizer $sanitizer failed; retrying with --sanitizer none" >&2
    sanitizer=none
    build none
fi
echo "fuzz.sh: built [$targets] (sanitizer: $sanitizer) in $(( $(date +%s) - start )) s"

if [ -n "${FUZZ_KEEP:-}" ]; then
    work="$FUZZ_KEEP"
    mkdir -p "$work"
else
    work="$(mktemp -d "${TMPDIR:-/tmp}/berth-fuzz.XXXXXX")"
    trap 'rm -rf -- "$work"' EXIT
fi

failed=""
summary=""
for t in $targets; do
    corpus="$work/corpus/$t"
    mkdir -p "$corpus"
    cp -- fuzz/seeds/"$t"/* "$corpus"/
    max_len=4096
    [ "$t" = layer ] && max_len=65536
    log="$work/$t.log"
    echo "fuzz.sh: running $t for $secs s"
    status=0
    cargo fuzz run --sanitizer "$sanitizer" "$t" "$corpus" -- \
        -max_total_time="$secs" -max_len="$max_len" -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    line="$t: ${runs:-?} runs, ${rate:-?} exec/s, corpus $(ls "$corpus" | wc -l) inputs"
    if [ "$status" -ne 0 ]; then
        line="$line: FAILED (exit $status)"
        failed="$failed $t"
        tail -n 60 "$log" >&2
    fi
    echo "fuzz.sh: $line"
    summary="$summary$line"$'\n'
done

printf '\nfuzz.sh summary (%s s per target, sanitizer %s):\n%s' "$secs" "$sanitizer" "$summary"
if [ -n "$failed" ]; then
    echo "fuzz.sh: crashes in:$failed (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
