#!/usr/bin/env bash
# Usage: bench/scale.sh [RUNS]   (as root)
#
# One new image on N nodes at once (`srun -N N`, N = BERTH_TEST_NODES, at
# least 4, default 4), in three modes, RUNS (default 3) of each, interleaved:
#   node-local  every node pulls into its own store (fanout=none)
#   fan-out     the first node pulls, sbcast carries the squashfs to the others
#               (fanout=sbcast)
#   shared      one store folder for all nodes (store_shared=1); skipped with
#               a message when the installed plugin does not know the key
# Before each run every node store (and the shared one) is emptied, so the
# image is new each time. Prints per mode: registry GETs per blob and in all,
# bytes the registry served for blobs (from its access log), and the time
# from srun's start to the first task on every node (each task prints its
# start time), medians over the runs.
#
# Image: BERTH_SCALE_IMAGE (a name in the test registry, default
# mpich:bookworm, ~71 MB in 2 layers, pushed by tests/harness/images.sh
# unless the registry already has it).
# Starts its own registry and cluster (BERTH_TEST_NAME, default berthscale;
# BERTH_TEST_SLOT, default 2; ports from the BERTH_TEST_*_PORT variables as in
# tests/harness) and tears them down.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RUNS=${1:-3}
[[ $(id -u) -eq 0 ]] || { echo "bench/scale.sh must run as root" >&2; exit 1; }
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthscale} BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-2}
export BERTH_TEST_NODES=${BERTH_TEST_NODES:-4}
((BERTH_TEST_NODES >= 4)) || { echo "BERTH_TEST_NODES must be at least 4" >&2; exit 1; }
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
NAME_IMAGE=${BERTH_SCALE_IMAGE:-mpich:bookworm}
tests/harness/install-deps.sh >/dev/null
source tests/harness/rust-env.sh
STATE=/var/lib/$BERTH_TEST_NAME
PREFIX=$STATE/prefix
make install PREFIX="$PREFIX" >/dev/null
trap '"$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1; "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1' EXIT
tests/harness/registry.sh up >/dev/null
source tests/harness/lib.sh >/dev/null
BASE="required $PREFIX/lib/slurm/spank_berth.so helper_path=$PREFIX/bin/berth runtime_path=/run/$BERTH_TEST_NAME/berth insecure_registries=$REGISTRY_ADDR"
LOCAL_STORE="store_path=$STATE/nodes/%n/berth-store"
SHARED=$STATE/shared-store
export BERTH_PLUGSTACK_LINE="$BASE $LOCAL_STORE"
tests/harness/cluster.sh up >/dev/null
# An image pushed beforehand (for example a bench/pull.sh image, with
# skopeo, to this registry) is used as it is.
if ! curl -sf -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REGISTRY_ADDR/v2/${NAME_IMAGE%%:*}/manifests/${NAME_IMAGE#*:}"; then
    tests/harness/images.sh push "${NAME_IMAGE%%:*}" >/dev/null
fi
source "/run/$BERTH_TEST_NAME/env"
cd "$BERTH_TEST_WORKDIR"
IMAGE=$BERTH_TEST_REGISTRY/$NAME_IMAGE
REPO_PATH=${NAME_IMAGE%%:*}
DROPIN=$BERTH_TEST_PLUGSTACK_DIR/berth.conf
N=$BERTH_TEST_NODES

line_for() {
    case $1 in
    node-local) echo "$BASE $LOCAL_STORE" ;;
    fan-out) echo "$BASE $LOCAL_STORE fanout=sbcast fanout_min_nodes=4 fanout_dir=/tmp/berth-fanout" ;;
    shared) echo "$BASE store_path=$SHARED store_shared=1" ;;
    esac
}

modes=(node-local fan-out shared)
echo "$(line_for shared)" >"$DROPIN"
if probe=$(runuser -u berthuser -- srun -N1 true 2>&1); then
    :
else
    echo "shared mode skipped: this berth does not take store_shared=1 ($(grep -o 'unknown argument[^(]*' <<<"$probe" | head -1))" >&2
    modes=(node-local fan-out)
fi

empty_stores() {
    local i
    for ((i = 1; i <= N; i++)); do
        rm -rf "$STATE/nodes/node$i/berth-store" "$STATE/nodes/node$i/tmp/berth-fanout"
    done
    rm -rf "$SHARED"
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A first total gets bytes
for ((run = 1; run <= RUNS; run++)); do
    for mode in "${modes[@]}"; do
        line_for "$mode" >"$DROPIN"
        empty_stores
        before=$(wc -l <"$BERTH_TEST_REGISTRY_LOG")
        out=$STATE/scale-$mode-$run.out
        t0=$(date +%s.%N)
        runuser -u berthuser -- srun -p wide -N"$N" "--container-image=$IMAGE" \
            sh -c 'echo "start $(hostname) $(date +%s.%N)"' >"$out" 2>"$out.err" ||
            { echo "$mode run $run failed:" >&2; cat "$out.err" >&2; exit 1; }
        t1=$(date +%s.%N)
        sleep 1 # the registry's log lines land
        tail -n +"$((before + 1))" "$BERTH_TEST_REGISTRY_LOG" | grep "\"GET /v2/$REPO_PATH/blobs/" >"$out.reg" || true
        per_blob=$(awk '{print $7}' "$out.reg" | sort | uniq -c | awk '{print $1}' | sort -n | uniq -c |
            awk '{printf "%s%d blob(s) x%d", (NR > 1 ? ", " : ""), $1, $2}')
        gets[$mode]+="$(wc -l <"$out.reg") "
        bytes[$mode]+="$(awk '$9 == 200 {s += $10} END {print s + 0}' "$out.reg") "
        times=$(awk -v t0="$t0" '$1 == "start" {printf "%s=%.2f ", $2, $3 - t0}' "$out")
        last=$(awk -v t0="$t0" '$1 == "start" && $3 - t0 > m {m = $3 - t0} END {printf "%.2f", m}' "$out")
        first[$mode]+="$last "
        total[$mode]+="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') "
        echo "run $run $mode: blob GETs: $per_blob; first task per node (s after srun start): $times" >&2
    done
done

echo
echo "$N nodes, image $IMAGE, medians of $RUNS runs (stores emptied before each run)"
printf '%-11s %14s %16s %26s %14s\n' mode "blob GETs" "blob MB served" "first task on every node" "srun total"
for mode in "${modes[@]}"; do
    g=$(tr ' ' '\n' <<<"${gets[$mode]}" | grep . | median)
    b=$(tr ' ' '\n' <<<"${bytes[$mode]}" | grep . | median)
    f=$(tr ' ' '\n' <<<"${first[$mode]}" | grep . | median)
    t=$(tr ' ' '\n' <<<"${total[$mode]}" | grep . | median)
    printf '%-11s %14s %16.1f %24s s %12s s\n' "$mode" "$g" "$(awk -v b="$b" 'BEGIN {print b / 1e6}')" "$f" "$t"
done
