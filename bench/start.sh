#!/usr/bin/env bash
# Usage: bench/start.sh [RUNS]   (as root)
#
# Start cost of a containerized step against a bare one, on the local test
# cluster, in one run, as the ordinary test user, RUNS (default 10) of each,
# interleaved: bare `srun -n1 true`; warm `srun -n1 --container-image=IMG true`
# with busybox (about 2 MB) and with the ~3 GB synthetic image of
# bench/pull.sh (start cost must not grow with image size); and 64 tasks on
# one node (`srun -N1 -n64 --overcommit`) bare and in a container. Prints each
# median, the added milliseconds and the ratios. Images are pulled once on
# every node before timing (the warm case is what every step after the first
# sees).
# Then, in one allocation with a step running `--container-name=x`, RUNS
# further steps joining x against RUNS bare steps, interleaved: the added
# cost of joining a running named container.
#
# Uses the cluster named by BERTH_TEST_ENV (an env file from
# tests/harness/cluster.sh) when set; otherwise builds berth, starts its own
# registry and cluster (BERTH_TEST_NAME, default berthbench; BERTH_TEST_SLOT,
# default 2; ports from the BERTH_TEST_*_PORT variables as in tests/harness)
# and tears them down.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RUNS=${1:-10}
[[ $(id -u) -eq 0 ]] || { echo "bench/start.sh must run as root" >&2; exit 1; }
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

own_cluster=0
if [[ -z ${BERTH_TEST_ENV:-} ]]; then
    own_cluster=1
    export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthbench} BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-2}
    export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
    tests/harness/install-deps.sh >/dev/null
    source tests/harness/rust-env.sh
    PREFIX=/var/lib/$BERTH_TEST_NAME/prefix
    make install PREFIX="$PREFIX" >/dev/null
    source bench/lib.sh
    bench_cluster_up "$PREFIX"
    BERTH_TEST_ENV=/run/$BERTH_TEST_NAME/env
fi
source "$BERTH_TEST_ENV"
cd "$BERTH_TEST_WORKDIR"
IMAGE=$BERTH_TEST_REGISTRY/busybox:latest
as_user() { runuser -u berthuser -- "$@"; }

NODES_ALL=${BERTH_TEST_NODES:-2}
as_user srun -N"$NODES_ALL" "--container-image=$IMAGE" true   # pull once on every node

# The ~3 GB synthetic image of bench/pull.sh (bench/make-image.py), built once
# and cached; start cost must not grow with image size.
BIG_LAYOUT=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/bench-pull/layout
if [[ ! -d $BIG_LAYOUT ]]; then
    echo "building the ~3 GB synthetic image in $BIG_LAYOUT (once; a few minutes)" >&2
    python3 "$REPO/bench/make-image.py" "$BIG_LAYOUT" >&2
fi
skopeo copy --quiet --dest-tls-verify=false "oci:$BIG_LAYOUT:big" "docker://$BERTH_TEST_REGISTRY/bench/start:big"
BIG=$BERTH_TEST_REGISTRY/bench/start:big
# The synthetic image has no programs: both images get the host's static
# busybox bound in and run `busybox true`, so they differ only in size.
TRUE_BIND=--container-mounts=/usr/bin/busybox:/usr/local/bin/busybox:ro
as_user srun -N"$NODES_ALL" "--container-image=$BIG" "$TRUE_BIND" /usr/local/bin/busybox true   # pull and convert once on every node

source "$REPO/bench/lib.sh"
BENCH_STEP_ERR=$(mktemp /tmp/berth-bench-step.XXXXXX)
chmod 666 "$BENCH_STEP_ERR"
ms() { bench_ms "$@"; }
bare=() container=() big=() bare64=() container64=()
for ((i = 0; i < RUNS; i++)); do
    bare+=("$(ms as_user srun -n1 true)")
    container+=("$(ms as_user srun -n1 "--container-image=$IMAGE" "$TRUE_BIND" /usr/local/bin/busybox true)")
    big+=("$(ms as_user srun -n1 "--container-image=$BIG" "$TRUE_BIND" /usr/local/bin/busybox true)")
    bare64+=("$(ms as_user srun -N1 -n64 --overcommit true)")
    container64+=("$(ms as_user srun -N1 -n64 --overcommit "--container-image=$IMAGE" true)")
done
mb=$(printf '%s\n' "${bare[@]}" | median)
mc=$(printf '%s\n' "${container[@]}" | median)
mg=$(printf '%s\n' "${big[@]}" | median)
mb64=$(printf '%s\n' "${bare64[@]}" | median)
mc64=$(printf '%s\n' "${container64[@]}" | median)
echo "bare srun -n1 true:                     median ${mb} ms  (runs: ${bare[*]})"
echo "srun -n1 --container-image=busybox:     median ${mc} ms  (runs: ${container[*]})"
echo "srun -n1 --container-image=3 GB image:  median ${mg} ms  (runs: ${big[*]})"
echo "bare srun -N1 -n64 --overcommit true:   median ${mb64} ms  (runs: ${bare64[*]})"
echo "same with --container-image=busybox:    median ${mc64} ms  (runs: ${container64[*]})"
awk -v c="$mc" -v b="$mb" 'BEGIN {printf "ratio container/bare: %.2f  (container setup adds %d ms; goal <= 100 ms)\n", c / b, c - b}'
awk -v g="$mg" -v c="$mc" -v b="$mb" 'BEGIN {printf "3 GB image adds %d ms, busybox adds %d ms: the large image costs %+.0f%% (goal: within 20%%)\n", g - b, c - b, ((c - b) > 0 ? 100 * ((g - b) / (c - b) - 1) : 0)}'
awk -v c64="$mc64" -v b64="$mb64" -v c="$mc" -v b="$mb" 'BEGIN {printf "64 tasks on one node add %d ms in all, %.2fx the single-task figure (goal <= 2x)\n", c64 - b64, ((c - b) > 0 ? (c64 - b64) / (c - b) : 0)}'

# Joining a running named container, in one allocation: step 1 holds x.
inner=$(mktemp /tmp/berth-bench-join.XXXXXX)
chmod 755 "$inner"
cat >"$inner" <<EOF
#!/bin/bash
set -u
stop=/tmp/berth-bench-stop-\$SLURM_JOB_ID
rm -f \$stop
srun --overlap -n1 --container-image=$IMAGE --container-name=x sh -c "while [ ! -e \$stop ]; do sleep 0.1; done" &
holder=\$!
for i in \$(seq 1 100); do srun --overlap -n1 --container-name=x:exec true 2>/dev/null && break; sleep 0.2; done
ms() { local t0 t1; t0=\$(date +%s%N); "\$@" >/dev/null 2>&1 || { echo "failed \$*"; return 1; }; t1=\$(date +%s%N); echo \$(((t1 - t0) / 1000000)); }
for ((i = 0; i < $RUNS; i++)); do
    t=\$(ms srun --overlap -n1 true) || { echo "\$t"; break; }
    echo "bare \$t"
    t=\$(ms srun --overlap -n1 --container-name=x true) || { echo "\$t"; break; }
    echo "join \$t"
done
srun --overlap -n1 touch \$stop
wait \$holder
rm -f \$stop
EOF
lines=$(as_user salloc -N1 "$inner" 2>/dev/null)
rm -f "$inner" "$BENCH_STEP_ERR"
if grep -q '^failed ' <<<"$lines"; then
    echo "bench/start.sh: a measured step of the join bench failed, so it is not timed: $(grep '^failed ' <<<"$lines" | head -1)" >&2
    exit 1
fi
jb=$(awk '$1 == "bare" {print $2}' <<<"$lines" | median)
jj=$(awk '$1 == "join" {print $2}' <<<"$lines" | median)
echo "bare step in an allocation:             median ${jb} ms  (runs: $(awk '$1 == "bare" {printf "%s ", $2}' <<<"$lines"))"
echo "step joining --container-name=x:        median ${jj} ms  (runs: $(awk '$1 == "join" {printf "%s ", $2}' <<<"$lines"))"
awk -v j="$jj" -v b="$jb" 'BEGIN {printf "second step of a job joining --container-name=x: adds %d ms vs a bare step in the same allocation (goal <= 50 ms)\n", j - b}'
