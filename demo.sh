#!/usr/bin/env bash
# Usage: ./demo.sh [--keep]   (as root)
#
# On a fresh Debian 12 machine: installs what is missing, builds and installs
# berth under /var/lib/berthdemo/prefix, starts a local registry and a
# two-node Slurm cluster (its own slurm.conf, ports, bridge and namespaces),
# pushes a small test image, and runs a containerized job with
# `srun --container-image` on both nodes as an ordinary user. Tears it all
# down at the end unless --keep is given.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$REPO"
export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthdemo}
export BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-1}
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
export BERTH_TEST_SLURMCTLD_PORT=${BERTH_TEST_SLURMCTLD_PORT:-16917}
export BERTH_TEST_SLURMD_PORT=${BERTH_TEST_SLURMD_PORT:-16918}
export BERTH_TEST_REGISTRY_PORT=${BERTH_TEST_REGISTRY_PORT:-15100}
export BERTH_TEST_TOKEN_REGISTRY_PORT=${BERTH_TEST_TOKEN_REGISTRY_PORT:-15101}
export BERTH_TEST_TOKEN_SERVER_PORT=${BERTH_TEST_TOKEN_SERVER_PORT:-15102}
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID
keep=0
[[ ${1:-} == --keep ]] && keep=1

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
[[ $(id -u) -eq 0 ]] || { echo "demo.sh must run as root (it starts a Slurm cluster)" >&2; exit 1; }

say "installing packages (Slurm, munge, registry, squashfs tools)"
tests/harness/install-deps.sh
source tests/harness/rust-env.sh

STATE=/var/lib/$BERTH_TEST_NAME
PREFIX=$STATE/prefix
say "building berth and installing it under $PREFIX"
make install PREFIX="$PREFIX"

cleanup() {
    if [[ $keep == 1 ]]; then
        say "cluster left running: source /run/$BERTH_TEST_NAME/env, then try srun; stop with"
        echo "  BERTH_TEST_NAME=$BERTH_TEST_NAME $REPO/tests/harness/cluster.sh down"
        echo "  BERTH_TEST_NAME=$BERTH_TEST_NAME $REPO/tests/harness/registry.sh down"
    else
        say "tearing down"
        "$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1 || true
        "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

say "starting a registry and a two-node Slurm cluster"
tests/harness/registry.sh up
source tests/harness/lib.sh >/dev/null
export BERTH_PLUGSTACK_LINE="required $PREFIX/lib/slurm/spank_berth.so helper_path=$PREFIX/bin/berth store_path=$STATE/nodes/%n/berth-store runtime_path=/run/$BERTH_TEST_NAME/berth insecure_registries=$REGISTRY_ADDR"
tests/harness/cluster.sh up
source "/run/$BERTH_TEST_NAME/env"

say "building and pushing the test image $REGISTRY_ADDR/busybox:latest"
tests/harness/images.sh build busybox
tests/harness/images.sh push busybox

cd "$BERTH_TEST_WORKDIR"
job_cmd=(srun -N2 -n2 "--container-image=$REGISTRY_ADDR/busybox:latest"
    sh -c 'echo "$(hostname): $(grep PRETTY_NAME /etc/os-release) as $(id -un) in $(pwd)"')
say "as user berthuser: ${job_cmd[*]}"
runuser -u berthuser -- "${job_cmd[@]}"
say "again (the image is cached on both nodes now)"
time runuser -u berthuser -- "${job_cmd[@]}"
say "demo finished"
