# Shared by the bench scripts (sourced): a cluster of their own, timing one
# measured step, medians.
#
# bench_ms COMMAND...: its wall time in ms, stdout dropped. A failing step
# stops the bench, since a failure is not a start time: its stderr is shown,
# and so is the file named by BENCH_STEP_LOG when set and not empty (a batch
# job's output). Needs BENCH_STEP_ERR, a file every test user may write.
bench_ms() {
    local t0 t1
    t0=$(date +%s%N)
    if ! "$@" >/dev/null 2>"$BENCH_STEP_ERR"; then
        echo "${0##*/}: a measured step failed, so it is not timed: $*" >&2
        cat "$BENCH_STEP_ERR" >&2
        [[ -n ${BENCH_STEP_LOG:-} && -s $BENCH_STEP_LOG ]] && cat "$BENCH_STEP_LOG" >&2
        return 1
    fi
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}

# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# bench_cluster_up PREFIX: a registry and a cluster of BERTH_TEST_NAME with
# berth of PREFIX on the plugstack line and busybox pushed, torn down when
# the script exits; its env file is /run/$BERTH_TEST_NAME/env. Run from the
# checkout.
bench_cluster_up() {
    local prefix=$1 state=/var/lib/$BERTH_TEST_NAME
    trap '"$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1; "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1' EXIT
    tests/harness/registry.sh up >/dev/null
    source tests/harness/lib.sh >/dev/null
    export BERTH_PLUGSTACK_LINE="required $prefix/lib/slurm/spank_berth.so helper_path=$prefix/bin/berth store_path=$state/nodes/%n/berth-store runtime_path=/run/$BERTH_TEST_NAME/berth insecure_registries=$REGISTRY_ADDR"
    tests/harness/cluster.sh up >/dev/null
    tests/harness/images.sh push busybox >/dev/null
}

# bench_cached_layout DIR STAMP COMMAND...: unless DIR/stamp says STAMP,
# builds the OCI layout DIR/layout by COMMAND DIR/layout (its stdout into
# DIR/stats.json).
bench_cached_layout() {
    local dir=$1 stamp=$2
    shift 2
    [[ $(cat "$dir/stamp" 2>/dev/null) == "$stamp" ]] && return
    echo "building the synthetic image in $dir (once; a few minutes)" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    "$@" "$dir/layout" >"$dir/stats.json"
    echo "$stamp" >"$dir/stamp"
}

# bench_small_layout DIR FILES: bench/make-small-image.py's image of FILES
# files as the OCI layout DIR/layout (tag "img"), built once (pull.sh and
# scale.sh share DIR). Run from the checkout.
bench_small_layout() {
    local stamp
    stamp=$(cat bench/make-image.py bench/make-small-image.py | sha256sum | cut -c1-16)-$2
    bench_cached_layout "$1" "$stamp" python3 bench/make-small-image.py "$2"
}
