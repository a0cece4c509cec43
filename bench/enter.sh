#!/usr/bin/env bash
# Usage: bench/enter.sh trixie|sid [RUNS]   (as root)
#
# How a task enters its container on Slurm 23.11 and later, measured in one
# run on one cluster of that release (a release root, see tests/release.sh):
# the exec step berth uses there (`spank_prepend_task_argv`: Slurm's own task
# setup, TaskProlog included, runs on the host, then `berth __enter` joins the
# container and execs the command) against its peer, the join in `task_init`
# that Slurm 22.05 needs (berth built with BERTH_ENTER_IN_TASK_INIT=1).
# RUNS (default 10) of each, interleaved: bare `srun -n1 true`, warm
# `srun -n1 --container-image=busybox true` with each build, and the same with
# 64 tasks on one node (`-N1 -n64 --overcommit`). The cluster has no
# TaskProlog (the join build cannot run one on 24.11.0 to 24.11.6). Between
# steps the plugstack drop-in is switched from one build to the other
# (slurmstepd reads it for each step). Prints each median and the ratios.
#
# Builds both outside the root (target/slurm-SUITE and target/slurm-SUITE-join,
# the second seeded from the first), then runs itself inside it (--inner).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
[[ $(id -u) -eq 0 ]] || { echo "bench/enter.sh must run as root" >&2; exit 1; }

if [[ ${1:-} != --inner ]]; then
    suite=${1:?usage: bench/enter.sh trixie|sid [RUNS]}
    runs=${2:-10}
    case $suite in trixie | sid) ;; *) echo "bench/enter.sh: unknown release root '$suite'" >&2; exit 2 ;; esac
    source tests/harness/rust-env.sh
    log() { printf '[bench] %s\n' "$*" >&2; }
    source tests/harness/release-lib.sh
    target=${CARGO_TARGET_DIR:-$REPO/target}
    tests/harness/release-root.sh "$suite" build
    root=$(tests/harness/release-root.sh "$suite" path)
    exec_dir=$target/slurm-$suite join_dir=$target/slurm-$suite-join
    if [[ ! -d $join_dir/release/deps && -d $exec_dir/release/deps ]]; then
        mkdir -p "$join_dir/release"
        cp -a "$exec_dir/release/deps" "$exec_dir/release/build" "$exec_dir/release/.fingerprint" "$join_dir/release/"
    fi
    build_berth_with_headers "$exec_dir" "$root/usr/include/slurm" "of the $suite root (exec step)" >&2
    BERTH_ENTER_IN_TASK_INIT=1 build_berth_with_headers "$join_dir" "$root/usr/include/slurm" \
        "of the $suite root (join in task_init)" >&2
    mapfile -t cluster_env < <(release_cluster_env 48 berthbench-enter)
    exec tests/harness/release-root.sh "$suite" enter env "${cluster_env[@]}" \
        BERTH_TEST_NODES=1 BERTH_TEST_TASK_PROLOG=none \
        BERTH_TEST_CACHE_DIR="${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/images-$suite" \
        BENCH_EXEC_TARGET="$exec_dir" BENCH_JOIN_TARGET="$join_dir" \
        bench/enter.sh --inner "$runs"
fi

# Inside the root.
runs=${2:-10}
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID
state=/var/lib/$BERTH_TEST_NAME
exec_prefix=$state/prefix-exec join_prefix=$state/prefix-join
make --no-print-directory install-built PREFIX="$exec_prefix" TARGET_DIR="$BENCH_EXEC_TARGET" >/dev/null
make --no-print-directory install-built PREFIX="$join_prefix" TARGET_DIR="$BENCH_JOIN_TARGET" >/dev/null
source bench/lib.sh
bench_cluster_up "$exec_prefix"
source "/run/$BERTH_TEST_NAME/env"
cd "$BERTH_TEST_WORKDIR"
dropin=$BERTH_TEST_PLUGSTACK_DIR/berth.conf
[[ -f $dropin ]] || { echo "bench/enter.sh: no plugstack drop-in $dropin" >&2; exit 1; }
exec_line=$(cat "$dropin")
join_line=${exec_line//$exec_prefix/$join_prefix}
use() { printf '%s\n' "$1" >"$dropin"; }

IMAGE=$BERTH_TEST_REGISTRY/busybox:latest
as_user() { runuser -u berthuser -- "$@"; }
source "$REPO/bench/lib.sh"
BENCH_STEP_ERR=$(mktemp /tmp/berth-bench-step.XXXXXX)
chmod 666 "$BENCH_STEP_ERR"
ms() { bench_ms "$@"; }
one() { as_user srun -n1 "--container-image=$IMAGE" true; }
many() { as_user srun -N1 -n64 --overcommit "--container-image=$IMAGE" true; }
for line in "$exec_line" "$join_line"; do
    use "$line"
    one >/dev/null # the pull, and a check that this build runs
done
# Which way each build entered, from slurmd's log: the exec step logs
# "prepared to enter", the join "joined the container".
bare=() by_exec=() by_join=() bare64=() exec64=() join64=()
for ((i = 0; i < runs; i++)); do
    bare+=("$(ms as_user srun -n1 true)")
    use "$exec_line"
    by_exec+=("$(ms one)")
    exec64+=("$(ms many)")
    use "$join_line"
    by_join+=("$(ms one)")
    join64+=("$(ms many)")
    bare64+=("$(ms as_user srun -N1 -n64 --overcommit true)")
done
use "$exec_line"
rm -f "$BENCH_STEP_ERR"
log=$BERTH_TEST_LOG_DIR/slurmd-node1.log
prepared=$(grep -c "prepared to enter the container" "$log" || true)
joined=$(grep -c "joined the container in" "$log" || true)
m() { printf '%s\n' "$@" | median; }
mb=$(m "${bare[@]}") me=$(m "${by_exec[@]}") mj=$(m "${by_join[@]}")
mb64=$(m "${bare64[@]}") me64=$(m "${exec64[@]}") mj64=$(m "${join64[@]}")
echo "Slurm $(slurmd -V | awk '{print $2}'), $runs runs each, interleaved (slurmd log: $prepared steps entered by the exec step, $joined by the join)"
echo "bare srun -n1 true:                       median ${mb} ms  (runs: ${bare[*]})"
echo "srun -n1 --container-image, exec step:    median ${me} ms  (runs: ${by_exec[*]})"
echo "srun -n1 --container-image, task_init:    median ${mj} ms  (runs: ${by_join[*]})"
echo "bare srun -N1 -n64 --overcommit true:     median ${mb64} ms  (runs: ${bare64[*]})"
echo "64 tasks --container-image, exec step:    median ${me64} ms  (runs: ${exec64[*]})"
echo "64 tasks --container-image, task_init:    median ${mj64} ms  (runs: ${join64[*]})"
awk -v e="$me" -v j="$mj" -v b="$mb" 'BEGIN {printf "1 task: the exec step adds %d ms over bare, the join %d ms: exec/join %.2f\n", e - b, j - b, ((j - b) > 0 ? (e - b) / (j - b) : 0)}'
awk -v e="$me64" -v j="$mj64" -v b="$mb64" 'BEGIN {printf "64 tasks: the exec step adds %d ms over bare, the join %d ms: exec/join %.2f\n", e - b, j - b, ((j - b) > 0 ? (e - b) / (j - b) : 0)}'
