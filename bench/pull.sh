#!/usr/bin/env bash
# Usage: bench/pull.sh [N]   (as root)
#
# Pull speed and memory of `berth pull`, medians of N runs (default 3) in one
# run, on the synthetic images named in BERTH_BENCH_IMAGES (default
# "large small300k small1m"):
#
#   large      bench/make-image.py: ~3 GB, ~40k files, 6 layers with deletes;
#   small300k  bench/make-small-image.py: 300,000 files of 1 to 4 KB of
#   small1m    text (1,000,000 for small1m) in packages of a few hundred
#              files, as in Python and CUDA images, over 30 gzip layers with
#              replacements, whiteouts and hard links.
#              BERTH_BENCH_SMALL_SCALE=0.01 scales their file counts (to try
#              the script).
#
# Before each measured run the page cache is dropped and the image's blobs
# in the registry are read back into memory (the registry stands for another
# machine, whose disk must not compete with the puller's). For the large
# image (the reference pipeline BERTH_BENCH_REF_RUNS times, default N):
#
#   1. cold `berth pull` (empty store) against `skopeo copy` + `umoci unpack`
#      + `mksquashfs` (zstd level 3, 128 KiB blocks, as berth) -> ratio (goal <= 0.5);
#   2. cold `berth pull` against the floor: every layer downloaded and
#      decompressed to /dev/null, all layers in parallel -> ratio (goal <= 1.5);
#   3. peak memory of `berth pull` plus its tar2sqfs child (RSS summed,
#      sampled every 50 ms; goal <= 256 MiB);
#   4. a pull of an image sharing its base layers with a stored one: blob GETs
#      counted in the registry's access log (only the new layer's);
#   5. a repeat pull of the stored image pinned by digest: time (goal <= 20 ms)
#      and registry requests during it (none).
#
# For each small-file image: its file count and compressed size, then
#
#   1. cold `berth pull` against the floor, here 4 layers at a time (as
#      berth downloads) -> ratio (goal <= 1.2);
#   2. peak memory of `berth pull` plus tar2sqfs, as above (goal <= 256 MiB);
#   3. with BERTH_BENCH_SMALL_REF=1 only (it is slow), the reference pipeline
#      as above, BERTH_BENCH_REF_RUNS times;
#   4. the cold pull again with each zstd level of BERTH_BENCH_LEVELS (default
#      "1"; "" for none) instead of the default 3 (`--squashfs-level`, the
#      plugstack's `squashfs_level`), in the same runs: time, ratio to the
#      floor and the squashfs's size.
#
# Each image is built once and cached under $BERTH_TEST_CACHE_DIR/bench-pull
# (the large one) or bench-pull-NAME (default /var/cache/berth-test; the 1M
# image in about two minutes on 2 cores). They are pushed to the test
# registry of tests/harness (BERTH_TEST_NAME/ports as for the tests; started
# here and stopped at the end when not running). Needs root, skopeo, umoci,
# mksquashfs, tar2sqfs, curl, jq, python3. Not part of the test suite (it
# takes minutes).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
N=${1:-3}
# The reference pipeline takes minutes per run: BERTH_BENCH_REF_RUNS=1 runs it once.
REF_RUNS=${BERTH_BENCH_REF_RUNS:-$N}
IMAGES=${BERTH_BENCH_IMAGES:-large small300k small1m}
SCALE=${BERTH_BENCH_SMALL_SCALE:-1}
SMALL_REF=${BERTH_BENCH_SMALL_REF:-0}
LEVELS=${BERTH_BENCH_LEVELS-1}
for name in $IMAGES; do
    [[ $name == large || $name == small300k || $name == small1m ]] ||
        { echo "bench/pull.sh: unknown image '$name' in BERTH_BENCH_IMAGES (large, small300k, small1m)" >&2; exit 2; }
done
[[ $SCALE =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "bench/pull.sh: BERTH_BENCH_SMALL_SCALE must be a number (got '$SCALE')" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "bench/pull.sh must run as root" >&2; exit 1; }
export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthbench}
export BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-2}
CACHE=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/bench-pull
WORK=/var/tmp/berth-bench-pull.$$
source tests/harness/lib.sh >/dev/null
source bench/lib.sh
REG=$REGISTRY_ADDR
REGLOG=$STATE_DIR/registry.log

BERTH=${BERTH:-}
if [[ -z $BERTH ]]; then
    [[ -f tests/harness/rust-env.sh ]] && source tests/harness/rust-env.sh
    cargo build --release --locked --bin berth >&2
    BERTH=$REPO/target/release/berth
fi

own_registry=0
cleanup() {
    rm -rf "$WORK"
    if ((own_registry)); then tests/harness/registry.sh down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
if ! curl -sf -o /dev/null "http://$REG/v2/"; then
    own_registry=1
    tests/harness/registry.sh up >/dev/null
fi
mkdir -p "$WORK"

# ---------------------------------------------------------------- the images
# push_image LAYOUT REPO_NAME TAG...: pushes the tags to the registry and
# describes the first: IMAGE, LAYERS (digests), DIGEST (its manifest's),
# COMPRESSED (bytes of its layers).
push_image() {
    local layout=$1 tag manifest
    REPO_NAME=$2
    shift 2
    for tag; do
        skopeo copy --quiet --dest-tls-verify=false "oci:$layout:$tag" "docker://$REG/$REPO_NAME:$tag"
    done
    IMAGE=$REG/$REPO_NAME:$1
    manifest=$(curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REG/v2/$REPO_NAME/manifests/$1")
    mapfile -t LAYERS < <(jq -r '.layers[].digest' <<<"$manifest")
    DIGEST=sha256:$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)
    COMPRESSED=$(jq '[.layers[].size] | add' <<<"$manifest")
}

# ---------------------------------------------------------------- helpers
now() { date +%s%N; }
secs() { awk -v ns="$1" 'BEGIN {printf "%.2f", ns / 1e9}'; }
# A run with warm caches is no cold pull: fail rather than report one.
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || {
        echo "bench/pull.sh: cannot drop the page cache (/proc/sys/vm/drop_caches): run as root on the host, not in a container" >&2
        exit 1
    }
}
# The registry stands for another machine: its disk must not compete with the
# puller's. After dropping the caches, read the image's layers back into
# memory so that every contender is served from RAM, as from a remote
# registry's cache.
warm_registry() {
    local blobs=$STATE_DIR/registry/anon/docker/registry/v2/blobs/sha256 l
    for l in "${LAYERS[@]}"; do
        l=${l#sha256:}
        cat "$blobs/${l:0:2}/$l/data"
    done >/dev/null
}
cold() { drop_caches; warm_registry; }
requests() { wc -l <"$REGLOG"; }
blob_gets() { grep -c "\"GET /v2/$1/blobs/sha256:" "$REGLOG" || true; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

# The pull as the plugin runs it: root pulls into a node store whose content
# areas belong to the pull user, so berth runs `berth __pull` as that user
# (a JSON request, credentials over a pipe) and converts there.
PULL_USER=${BERTH_BENCH_PULL_USER:-berth}
id -u "$PULL_USER" >/dev/null 2>&1 || { echo "bench/pull.sh: no pull user $PULL_USER (tests/harness/install-deps.sh makes it)" >&2; exit 1; }
node_store() {
    rm -rf "$1"
    install -d -m 0711 "$1"
    install -d -m 0700 -o "$PULL_USER" -g "$PULL_USER" "$1/images"
}

# berth_pull STORE REF [ARG...]: prints "seconds peak_rss_kib" (RSS of berth
# and its children summed, sampled every 50 ms by bench/peak-rss.py).
berth_pull() {
    local store=$1 ref=$2 t0 t1 pid peak
    shift 2
    [[ -d $store/images ]] || node_store "$store"
    t0=$(now)
    "$BERTH" pull --store "$store" --insecure-registry "$REG" "$@" "$ref" >"$WORK/pull.out" 2>"$WORK/pull.err" &
    pid=$!
    peak=$(python3 bench/peak-rss.py "$pid")
    wait "$pid" || { cat "$WORK/pull.err" >&2; exit 1; }
    t1=$(now)
    echo "$(secs $((t1 - t0))) $peak"
}

reference_pipeline() {
    local d=$WORK/ref t0 t1
    rm -rf "$d"
    mkdir -p "$d"
    t0=$(now)
    skopeo copy --quiet --src-tls-verify=false "docker://$IMAGE" "oci:$d/oci:ref"
    umoci unpack --image "$d/oci:ref" "$d/bundle" >/dev/null
    mksquashfs "$d/bundle/rootfs" "$d/image.sqfs" -comp zstd -Xcompression-level 3 -b 131072 -noappend -quiet >/dev/null
    t1=$(now)
    rm -rf "$d"
    secs $((t1 - t0))
}

# floor [P]: every layer of IMAGE downloaded and gunzipped to /dev/null, P at
# a time (default: all at once); prints the seconds.
floor() {
    local par=${1:-${#LAYERS[@]}} t0 t1 l
    t0=$(now)
    for l in "${LAYERS[@]}"; do
        while (($(jobs -rp | wc -l) >= par)); do wait -n; done
        curl -sf "http://$REG/v2/$REPO_NAME/blobs/$l" | gzip -dc >/dev/null &
    done
    wait
    t1=$(now)
    secs $((t1 - t0))
}

# measure REF_RUNS FLOOR_P [LEVEL...]: N runs on IMAGE, each from a cold
# cache: berth pull into an empty store with each zstd LEVEL, then with the
# default level (its stderr stays in pull.err), the reference pipeline (in
# the first REF_RUNS), the floor (FLOOR_P layers at a time). Sets the times berth_t, ref_t, floor_t, level_t[LEVEL] and the peaks
# berth_rss (KiB), their medians mb, mr, mf, mrss, and SQFS and
# level_sqfs[LEVEL] (the squashfs's bytes).
declare -A level_t level_sqfs
measure() {
    local ref_runs=$1 par=$2 i t rss ref lv lt
    shift 2
    berth_t=() berth_rss=() ref_t=() floor_t=() mr= level_t=() level_sqfs=()
    for ((i = 1; i <= N; i++)); do
        for lv; do
            node_store "$WORK/store-$lv"
            cold
            read -r lt _ < <(berth_pull "$WORK/store-$lv" "$IMAGE" --squashfs-level "$lv")
            level_t[$lv]+="$lt "
            level_sqfs[$lv]=$(stat -c %s "$WORK/store-$lv"/images/*/image.sqfs)
            rm -rf "$WORK/store-$lv"
            echo "run $i: berth --squashfs-level $lv ${lt}s" >&2
        done
        node_store "$WORK/store"
        cold
        read -r t rss < <(berth_pull "$WORK/store" "$IMAGE")
        berth_t+=("$t") berth_rss+=("$rss")
        ref=
        if ((i <= ref_runs)); then
            cold
            ref_t+=("$(reference_pipeline)")
            ref=", skopeo+umoci+mksquashfs ${ref_t[-1]}s"
        fi
        cold
        floor_t+=("$(floor "$par")")
        echo "run $i: berth ${t}s (peak ${rss} KiB)$ref, floor ${floor_t[-1]}s" >&2
    done
    mb=$(printf '%s\n' "${berth_t[@]}" | median)
    ((${#ref_t[@]} == 0)) || mr=$(printf '%s\n' "${ref_t[@]}" | median)
    mf=$(printf '%s\n' "${floor_t[@]}" | median)
    mrss=$(printf '%s\n' "${berth_rss[@]}" | median)
    SQFS=$(stat -c %s "$WORK"/store/images/*/image.sqfs)
    grep -E "files|warning" "$WORK/pull.err" | tail -3 | sed 's/^/  /'
}

# report FLOOR_WHAT RATIO_GOAL: the medians of measure, after its runs.
report() {
    echo "berth pull (cold), $N runs:              median ${mb} s   (${berth_t[*]}); squashfs $((SQFS / 1000000)) MB"
    if [[ -n $mr ]]; then
        echo "skopeo copy + umoci unpack + mksquashfs: median ${mr} s   (${ref_t[*]})"
        awk -v a="$mb" -v b="$mr" 'BEGIN {printf "  ratio berth / skopeo+umoci+mksquashfs: %.2f   (goal <= 0.5)\n", a / b}'
    fi
    echo "floor (download + gunzip every layer, $1): median ${mf} s   (${floor_t[*]})"
    awk -v a="$mb" -v b="$mf" -v g="$2" 'BEGIN {printf "  ratio berth / floor: %.2f   (goal <= %s)\n", a / b, g}'
    awk -v k="$mrss" 'BEGIN {printf "peak RSS of berth pull (and any child): median %.0f MiB   (goal <= 256 MiB)\n", k / 1024}'
    local lv m
    for lv in "${!level_t[@]}"; do
        m=$(tr ' ' '\n' <<<"${level_t[$lv]}" | grep . | median)
        awk -v lv="$lv" -v m="$m" -v runs="${level_t[$lv]% }" -v f="$mf" -v g="$2" -v s="${level_sqfs[$lv]}" -v d="$SQFS" 'BEGIN {
            printf "berth pull --squashfs-level %s: median %s s   (%s); squashfs %d MB (%+.0f%% against level 3)\n", lv, m, runs, s / 1e6, 100 * (s / d - 1)
            printf "  ratio berth / floor: %.2f   (goal <= %s)\n", m / f, g }'
    done
}

# ---------------------------------------------------------------- the images' runs
bench_large() {
    local before tplus plus_gets rep rep_requests mrep i t0 t1
    bench_cached_layout "$CACHE" "$(sha256sum bench/make-image.py | cut -c1-16)" python3 bench/make-image.py
    push_image "$CACHE/layout" bench/pull big plus
    echo "image $IMAGE ($DIGEST): ${#LAYERS[@]} layers, $((COMPRESSED / 1000000)) MB compressed"
    measure "$REF_RUNS" "${#LAYERS[@]}"

    # Shared base: the store holds :big; :plus adds one layer.
    before=$(blob_gets "$REPO_NAME")
    read -r tplus _ < <(berth_pull "$WORK/store" "$REG/$REPO_NAME:plus")
    plus_gets=$(($(blob_gets "$REPO_NAME") - before))

    # Repeat pull pinned by digest.
    before=$(requests)
    rep=()
    for ((i = 1; i <= N * 3; i++)); do
        t0=$(now)
        "$BERTH" pull --store "$WORK/store" --insecure-registry "$REG" "$REG/$REPO_NAME@$DIGEST" >/dev/null 2>&1
        t1=$(now)
        rep+=("$(awk -v ns=$((t1 - t0)) 'BEGIN {printf "%.1f", ns / 1e6}')")
    done
    rep_requests=$(($(requests) - before))
    mrep=$(printf '%s\n' "${rep[@]}" | median)

    echo
    report "all at once" 1.5
    echo "pull of :plus over a store holding :big: ${tplus} s, blob GETs $plus_gets (new layers: 1, plus its config)"
    echo "repeat pull by digest: median ${mrep} ms (goal <= 20), registry requests during $((N * 3)) pulls: $rep_requests"
}

# bench_small NAME FILES: a small-file image of FILES files (times SCALE).
bench_small() {
    local name=$1 files dir ref_runs=0
    files=$(awk -v n="$2" -v s="$SCALE" 'BEGIN {printf "%d", n * s}')
    dir=$CACHE-$name
    [[ $SCALE == 1 ]] || dir+=-x$SCALE
    bench_small_layout "$dir" "$files"
    push_image "$dir/layout" "bench/$name" img
    jq -r --arg img "$IMAGE ($DIGEST)" --arg mb "$(mib "$COMPRESSED")" \
        '"image \($img): \(.files) files and \(.links) hard links (\(.final_files) in the final tree after \(.whiteouts) whiteouts), \(.layers) layers, \($mb) MiB compressed (\(.uncompressed / 1048576 | floor) MiB of tar)"' \
        "$dir/stats.json"
    if ((SMALL_REF)); then ref_runs=$REF_RUNS; fi
    # shellcheck disable=SC2086 # the levels are words
    measure "$ref_runs" 4 $LEVELS
    echo
    report "4 at a time" 1.2
}

for name in $IMAGES; do
    echo
    case $name in
    large) bench_large ;;
    small300k) bench_small small300k 300000 ;;
    small1m) bench_small small1m 1000000 ;;
    esac
    rm -rf "$WORK/store"
done
