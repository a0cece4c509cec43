#!/usr/bin/env bash
# Usage: bench/pull.sh [N]   (as root)
#
# Pull speed and memory of `berth pull` on a large synthetic image, medians of
# N runs (default 3; the reference pipeline BERTH_BENCH_REF_RUNS times,
# default N), in one run. Before each measured run the page cache is dropped
# and the registry's blobs are read back into memory (the registry stands for
# another machine, whose disk must not compete with the puller's):
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
# The image (bench/make-image.py: ~3 GB, ~40k files, 6 layers with deletes)
# is built once and cached under $BERTH_TEST_CACHE_DIR/bench-pull
# (default /var/cache/berth-test). It is pushed to the test registry of
# tests/harness (BERTH_TEST_NAME/ports as for the tests; started here and
# stopped at the end when not running). Needs root, skopeo, umoci, mksquashfs,
# tar2sqfs, curl, python3. Not part of the test suite (it takes minutes).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
N=${1:-3}
# The reference pipeline takes minutes per run: BERTH_BENCH_REF_RUNS=1 runs it once.
REF_RUNS=${BERTH_BENCH_REF_RUNS:-$N}
[[ $(id -u) -eq 0 ]] || { echo "bench/pull.sh must run as root" >&2; exit 1; }
export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthbench}
export BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-2}
CACHE=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/bench-pull
WORK=/var/tmp/berth-bench-pull.$$
source tests/harness/lib.sh >/dev/null
REG=$REGISTRY_ADDR
REGLOG=$STATE_DIR/registry.log
REPO_NAME=bench/pull

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

# ---------------------------------------------------------------- the image
stamp=$(sha256sum bench/make-image.py | cut -c1-16)
if [[ $(cat "$CACHE/stamp" 2>/dev/null) != "$stamp" ]]; then
    echo "building the synthetic image in $CACHE (once; a few minutes)" >&2
    rm -rf "$CACHE"
    mkdir -p "$CACHE"
    python3 bench/make-image.py "$CACHE/layout"
    echo "$stamp" >"$CACHE/stamp"
fi
for tag in big plus; do
    skopeo copy --quiet --dest-tls-verify=false "oci:$CACHE/layout:$tag" "docker://$REG/$REPO_NAME:$tag"
done
IMAGE=$REG/$REPO_NAME:big
manifest=$(curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REG/v2/$REPO_NAME/manifests/big")
mapfile -t LAYERS < <(jq -r '.layers[].digest' <<<"$manifest")
DIGEST=sha256:$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)
unpacked=$(jq -r '.rootfs.diff_ids | length' "$CACHE/layout/blobs/sha256/$(jq -r '.config.digest' <<<"$manifest" | cut -d: -f2)")
compressed=$(jq '[.layers[].size] | add' <<<"$manifest")
echo "image $IMAGE ($DIGEST): $unpacked layers, $((compressed / 1000000)) MB compressed"

# ---------------------------------------------------------------- helpers
now() { date +%s%N; }
secs() { awk -v ns="$1" 'BEGIN {printf "%.2f", ns / 1e9}'; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# A run with warm caches is no cold pull: fail rather than report one.
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || {
        echo "bench/pull.sh: cannot drop the page cache (/proc/sys/vm/drop_caches): run as root on the host, not in a container" >&2
        exit 1
    }
}
# The registry stands for another machine: its disk must not compete with the
# puller's. After dropping the caches, read its blobs back into memory so
# that every contender is served from RAM, as from a remote registry's cache.
warm_registry() { find "$STATE_DIR/registry/anon" -type f -name data -exec cat {} + >/dev/null; }
cold() { drop_caches; warm_registry; }
requests() { wc -l <"$REGLOG"; }
blob_gets() { grep -c "\"GET /v2/$1/blobs/sha256:" "$REGLOG" || true; }

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

# berth_pull STORE REF: prints "seconds peak_rss_kib" (RSS of berth and its
# children summed, sampled every 50 ms by bench/peak-rss.py).
berth_pull() {
    local store=$1 ref=$2 t0 t1 pid peak
    [[ -d $store/images ]] || node_store "$store"
    t0=$(now)
    "$BERTH" pull --store "$store" --insecure-registry "$REG" "$ref" >"$WORK/pull.out" 2>"$WORK/pull.err" &
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
    skopeo copy --quiet --src-tls-verify=false "docker://$IMAGE" "oci:$d/oci:big"
    umoci unpack --image "$d/oci:big" "$d/bundle" >/dev/null
    mksquashfs "$d/bundle/rootfs" "$d/image.sqfs" -comp zstd -Xcompression-level 3 -b 131072 -noappend -quiet >/dev/null
    t1=$(now)
    rm -rf "$d"
    secs $((t1 - t0))
}

floor() {
    local t0 t1 l
    t0=$(now)
    for l in "${LAYERS[@]}"; do
        curl -sf "http://$REG/v2/$REPO_NAME/blobs/$l" | gzip -dc >/dev/null &
    done
    wait
    t1=$(now)
    secs $((t1 - t0))
}

# ---------------------------------------------------------------- runs
berth_t=() berth_rss=() ref_t=() floor_t=()
for ((i = 1; i <= N; i++)); do
    node_store "$WORK/store"
    cold
    read -r t rss < <(berth_pull "$WORK/store" "$IMAGE")
    berth_t+=("$t") berth_rss+=("$rss")
    if ((i <= REF_RUNS)); then
        cold
        ref_t+=("$(reference_pipeline)")
    fi
    cold
    floor_t+=("$(floor)")
    echo "run $i: berth ${t}s (peak ${rss} KiB), skopeo+umoci+mksquashfs ${ref_t[-1]}s, floor ${floor_t[-1]}s" >&2
done
mb=$(printf '%s\n' "${berth_t[@]}" | median)
mr=$(printf '%s\n' "${ref_t[@]}" | median)
mf=$(printf '%s\n' "${floor_t[@]}" | median)
mrss=$(printf '%s\n' "${berth_rss[@]}" | median)
sqfs=$(stat -c %s "$WORK"/store/images/*/image.sqfs)
grep -E "files|warning" "$WORK/pull.err" | tail -3 | sed 's/^/  /'

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
echo "berth pull (cold), $N runs:              median ${mb} s   (${berth_t[*]}); squashfs $((sqfs / 1000000)) MB"
echo "skopeo copy + umoci unpack + mksquashfs: median ${mr} s   (${ref_t[*]})"
awk -v a="$mb" -v b="$mr" 'BEGIN {printf "  ratio berth / skopeo+umoci+mksquashfs: %.2f   (goal <= 0.5)\n", a / b}'
echo "floor (download + gunzip all layers in parallel): median ${mf} s   (${floor_t[*]})"
awk -v a="$mb" -v b="$mf" 'BEGIN {printf "  ratio berth / floor: %.2f   (goal <= 1.5)\n", a / b}'
awk -v k="$mrss" 'BEGIN {printf "peak RSS of berth pull + tar2sqfs: median %.0f MiB   (goal <= 256)\n", k / 1024}'
echo "pull of :plus over a store holding :big: ${tplus} s, blob GETs $plus_gets (new layers: 1, plus its config)"
echo "repeat pull by digest: median ${mrep} ms (goal <= 20), registry requests during $((N * 3)) pulls: $rep_requests"
