#!/usr/bin/env bash
# Usage: bench/mpi.sh [RUNS]   (as root)
#
# MPI point-to-point bandwidth between two nodes of the local test cluster,
# inside berth containers with the host's MPICH injected (the bind
# approach: profile `bench-host`, --container-mpi=bench-host, srun
# --mpi=pmi2) and bare on the host (the same tests/images/mpi_bw.c built with
# the host's mpicc.mpich), RUNS times each (default 5), interleaved, as the
# ordinary test user. Prints the median bandwidth per message size for both
# and the ratio container/bare at 1 MiB (goal >= 0.97).
#
# Needs a running cluster: BERTH_TEST_ENV names its env file (see
# tests/harness/cluster.sh), with the mpich:bookworm test image pushed
# (tests/harness/images.sh push mpich) and inject_dir=$STATE/inject.d on the
# plugstack line (as tests/run.sh sets it).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-5}
[[ $(id -u) -eq 0 ]] || { echo "bench/mpi.sh must run as root" >&2; exit 1; }
[[ -n ${BERTH_TEST_ENV:-} ]] || { echo "set BERTH_TEST_ENV to the cluster's env file (/run/NAME/env)" >&2; exit 1; }
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID
source "$BERTH_TEST_ENV"
IMAGE=$BERTH_TEST_REGISTRY/mpich:bookworm
PROFILE_DIR=$BERTH_TEST_STATE_DIR/inject.d
mkdir -p "$PROFILE_DIR"
printf '# bench/mpi.sh: the host MPICH\nlibrary = libmpich.so.12\nlibrary = libmpichcxx.so.12\nlibrary = libmpichfort.so.12\nenv = UCX_TLS=tcp,self\n' \
    >"$PROFILE_DIR/bench-host.conf"
BIN=$BERTH_TEST_WORKDIR/mpi_bw-host
mpicc.mpich -O2 -o "$BIN" "$REPO/tests/images/mpi_bw.c"
chmod 755 "$BIN"
cd "$BERTH_TEST_WORKDIR"
as_user() { runuser -u berthuser -- "$@"; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# The test nodes share one kernel: UCX would use shared memory between them
# when it can (bare) and not in the container; TCP for both, as between
# real nodes without a fast interconnect.
export UCX_TLS=tcp,self
srun_bw() { as_user srun --mpi=pmi2 -N2 -n2 --ntasks-per-node=1 "$@"; }

srun_bw "--container-image=$IMAGE" --container-mpi=bench-host true # pull once
for ((i = 0; i < RUNS; i++)); do
    srun_bw "$BIN" >"$OUT/bare.$i"
    srun_bw "--container-image=$IMAGE" --container-mpi=bench-host mpi_bw >"$OUT/container.$i"
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf '%10s %14s %14s %7s\n' bytes "bare MB/s" "berth MB/s" ratio
for size in $(grep -hv '^#' "$OUT"/bare.0 | awk '{print $1}'); do
    b=$(cat "$OUT"/bare.* | awk -v s="$size" '$1 == s {print $2}' | median)
    c=$(cat "$OUT"/container.* | awk -v s="$size" '$1 == s {print $2}' | median)
    printf '%10s %14.1f %14.1f %7.3f\n' "$size" "$b" "$c" "$(awk -v c="$c" -v b="$b" 'BEGIN {print c / b}')"
    [[ $size == 1048576 ]] && ratio=$(awk -v c="$c" -v b="$b" 'BEGIN {printf "%.3f", c / b}')
done
echo "ratio container/bare at 1 MiB (median of $RUNS runs each): ${ratio:-n/a} (goal >= 0.97)"
