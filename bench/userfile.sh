#!/usr/bin/env bash
# Usage: bench/userfile.sh [N]   (as root, beside a running test cluster)
#
# A squashfs file that a user gives (`--container-image=/path/x.sqsh`): the
# two ways berth may run it without root's kernel parsing the user's bytes
# (issue 18, hole 3), on the ~3 GB synthetic image of bench/pull.sh, medians
# of N runs (default 3; first starts BERTH_BENCH_IMPORT_RUNS times, default 2),
# each way measured in this same run:
#
#   store:  root's `berth run FILE` re-packs the file into the store as the
#           pull user (`berth __import`: hash, copy, sqfs2tar | tar2sqfs),
#           then loop-mounts the store's copy with the kernel driver (what
#           the plugin does for every user file);
#   fuse:   the user's `berth run FILE`: squashfuse as the user, inside the
#           user's own namespace (what enroot does), on the file itself.
#
# Measured: first start (store: import + mount; fuse: mount), repeated start
# (store: the hash check finds the copy), reading every file with a cold
# page cache (MB/s; the bench fails when it cannot drop caches), and `find`
# over the tree with a cold cache; then (warm) that both ways read the same
# bytes (md5 of every file both root and the user may read, in name order). Every time includes starting the
# container (`busybox true` alone is the start time). Ratios are store/fuse.
#
# The image (bench/make-image.py) is built once and cached under
# $BERTH_TEST_CACHE_DIR/bench-pull (default /var/cache/berth-test), pushed to
# the cluster's registry (BERTH_TEST_NAME, default berthdev3: its
# /run/NAME/env) and pulled once into a scratch store to get its squashfs
# (cached as bench-pull/big.sqfs). BERTH: the berth binary (default: the
# cluster's installed one). Not part of the test suite (it takes minutes).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:-3}
IMPORTS=${BERTH_BENCH_IMPORT_RUNS:-2}
[[ $(id -u) -eq 0 ]] || { echo "bench/userfile.sh must run as root" >&2; exit 1; }
NAME=${BERTH_TEST_NAME:-berthdev3}
# shellcheck disable=SC1090
source "/run/$NAME/env"
BERTH=${BERTH:-$BERTH_TEST_STATE_DIR/prefix/bin/berth}
USER_NAME=${BERTH_TEST_USER:-berthuser}
CACHE=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/bench-pull
WORK=/var/tmp/berth-bench-userfile.$$
mkdir -p "$WORK" "$CACHE"
chmod 0755 "$WORK"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

SOURCE=${BERTH_BENCH_FILE:-$CACHE/big.sqfs}
if [[ -z ${BERTH_BENCH_FILE:-} && ! -d $CACHE/layout ]]; then
    echo "building the ~3 GB synthetic image in $CACHE/layout (once; a few minutes)" >&2
    python3 "$REPO/bench/make-image.py" "$CACHE/layout" >&2
fi
if [[ ! -f $SOURCE ]]; then
    echo "making its squashfs (once): push, pull into a scratch store" >&2
    skopeo copy --quiet --dest-tls-verify=false "oci:$CACHE/layout:big" \
        "docker://$BERTH_TEST_REGISTRY/bench/userfile:big"
    "$BERTH" pull --store "$WORK/scratch" --progress none \
        --insecure-registry "$BERTH_TEST_REGISTRY" "$BERTH_TEST_REGISTRY/bench/userfile:big" >/dev/null
    cp "$WORK"/scratch/images/*/image.sqfs "$CACHE/big.sqfs.tmp"
    mv "$CACHE/big.sqfs.tmp" "$CACHE/big.sqfs"
    rm -rf "$WORK/scratch"
fi
# The user's own file, in a folder of theirs.
install -d -o "$USER_NAME" -m 0755 "$WORK/home"
FILE=$WORK/home/big.sqfs
install -o "$USER_NAME" -m 0644 "$SOURCE" "$FILE"
echo "file: $(du -h "$FILE" | cut -f1) squashfs, owned by $USER_NAME" >&2

BIND=/usr/bin/busybox:/usr/local/bin/busybox:ro
BB=/usr/local/bin/busybox
STORE=$WORK/store
drop_caches() {
    sync
    if ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
        echo "bench/userfile.sh: cannot drop the page cache; cold numbers would be warm" >&2
        exit 1
    fi
}
# run_store|run_fuse ARGS...: the container command, as root (store) or the user (fuse).
run_store() { "$BERTH" run --store "$STORE" -m "$BIND" "$FILE" -- "$@"; }
run_fuse() { runuser -u "$USER_NAME" -- "$BERTH" run --store "$WORK/home/cache" -m "$BIND" "$FILE" -- "$@"; }
# ms CMD...: wall ms of a command that must succeed (its stdout to $WORK/out).
ms() {
    local t0 t1
    t0=$(date +%s%N)
    if ! "$@" >"$WORK/out" 2>"$WORK/err"; then
        echo "bench/userfile.sh: a measured step failed: $*" >&2
        cat "$WORK/err" >&2
        exit 1
    fi
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

first_store=() first_fuse=()
for _ in $(seq "$IMPORTS"); do
    rm -rf "$STORE"
    drop_caches
    first_store+=("$(ms run_store "$BB" true)")
    drop_caches
    first_fuse+=("$(ms run_fuse "$BB" true)")
done
again_store=() again_fuse=() read_store=() read_fuse=() find_store=() find_fuse=()
# What root and the user may both read: world-readable files in folders
# anyone may enter (root's run sees the image as root, the user's as the user).
VISIBLE="$BB find / -xdev \\( -type d ! -perm -005 -prune \\) -o"
# (/etc/passwd and /etc/group are made for each user: left out.)
FILES="$VISIBLE \\( -type f -perm -004 ! -path /etc/passwd ! -path /etc/group -print \\)"
READ="$FILES | $BB tr '\\n' '\\000' | $BB xargs -0 $BB cat | $BB wc -c"
FIND="$VISIBLE -print | $BB wc -l"
bytes=0 entries=0
for _ in $(seq "$N"); do
    drop_caches
    again_store+=("$(ms run_store "$BB" true)")
    again_fuse+=("$(ms run_fuse "$BB" true)")
    drop_caches
    read_store+=("$(ms run_store "$BB" sh -c "$READ")")
    bytes=$(tr -d ' \n' <"$WORK/out")
    drop_caches
    read_fuse+=("$(ms run_fuse "$BB" sh -c "$READ")")
    [[ $(tr -d ' \n' <"$WORK/out") == "$bytes" ]] || { echo "the two ways read different byte counts" >&2; exit 1; }
    drop_caches
    find_store+=("$(ms run_store "$BB" sh -c "$FIND")")
    entries=$(tr -d ' \n' <"$WORK/out")
    drop_caches
    find_fuse+=("$(ms run_fuse "$BB" sh -c "$FIND")")
done
# The same bytes both ways (warm): the re-packed copy holds what the file holds.
# (Sorted: fuse-overlayfs lists folders in another order than the kernel.)
SUM="$FILES | $BB sort | $BB tr '\\n' '\\000' | $BB xargs -0 $BB cat | $BB md5sum"
ms run_store "$BB" sh -c "$SUM" >/dev/null
sum_store=$(cat "$WORK/out")
ms run_fuse "$BB" sh -c "$SUM" >/dev/null
[[ $(cat "$WORK/out") == "$sum_store" ]] || { echo "the store copy reads other bytes than the file" >&2; exit 1; }
m() { echo "$@" | median; }
fs=$(m "${first_store[@]}") ff=$(m "${first_fuse[@]}")
as=$(m "${again_store[@]}") af=$(m "${again_fuse[@]}")
rs=$(m "${read_store[@]}") rf=$(m "${read_fuse[@]}")
ns=$(m "${find_store[@]}") nf=$(m "${find_fuse[@]}")
mbs() { awk -v b="$bytes" -v t="$1" 'BEGIN {printf "%.0f", b / 1048576 / (t / 1000)}'; }
echo "user squashfs file of $((bytes >> 20)) MiB in files, $entries entries; medians (ms); store/fuse"
printf '%-34s %9s %9s %7s\n' "" store fuse ratio
printf '%-34s %9s %9s %7s\n' "first start (import | mount)" "$fs" "$ff" "$(ratio "$fs" "$ff")"
printf '%-34s %9s %9s %7s\n' "repeated start (hash | mount)" "$as" "$af" "$(ratio "$as" "$af")"
printf '%-34s %9s %9s %7s\n' "read every file, cold (ms)" "$rs" "$rf" "$(ratio "$rs" "$rf")"
printf '%-34s %9s %9s %7s\n' "read every file, cold (MB/s)" "$(mbs "$rs")" "$(mbs "$rf")" "$(ratio "$rf" "$rs")"
printf '%-34s %9s %9s %7s\n' "find over the tree, cold (ms)" "$ns" "$nf" "$(ratio "$ns" "$nf")"
echo "runs: first ${first_store[*]} | ${first_fuse[*]}; again ${again_store[*]} | ${again_fuse[*]}"
echo "      read ${read_store[*]} | ${read_fuse[*]}; find ${find_store[*]} | ${find_fuse[*]}"
