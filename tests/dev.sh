#!/usr/bin/env bash
# Usage: tests/dev.sh SLOT up|install|test [CARGO TEST ARGS...]|down
#
# A developer's test cluster beside CI's: the same cluster, registries and
# images as tests/run.sh, as instance berthdev<SLOT> (SLOT 1..9) with its own
# /24 (10.77.<SLOT>.0; tests/run.sh uses 10.77.0.0), ports and prefix, left
# running between commands so that one test file can be run again and again.
#
#   tests/dev.sh 1 up                      build, install, start, push images
#   tests/dev.sh 1 install                 rebuild and reinstall berth only
#   tests/dev.sh 1 test --test suite -- cluster_named::some_test_name
#   tests/dev.sh 1 down                    tear it down
#
# Run as root. CARGO_TARGET_DIR defaults to the checkout's target/.
# BERTH_TEST_SITE=gpu (at up) makes it the GPU site (tests/README-harness.md).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
slot=${1:?usage: tests/dev.sh SLOT up|install|test|down}
verb=${2:?usage: tests/dev.sh SLOT up|install|test|down}
shift 2
[[ $slot =~ ^[1-9]$ ]] || { echo "SLOT must be 1..9 (10.77.0.0/24 is tests/run.sh's)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "tests/dev.sh must run as root" >&2; exit 1; }

export BERTH_TEST_NAME=berthdev$slot BERTH_TEST_SUBNET=10.77.$slot BERTH_TEST_SLOT=0
export BERTH_TEST_NODES=${BERTH_TEST_NODES:-4} BERTH_TEST_DEFAULT_NODES=${BERTH_TEST_DEFAULT_NODES:-2}
export BERTH_TEST_SLURMCTLD_PORT=$((16817 + 100 * slot)) BERTH_TEST_SLURMD_PORT=$((16818 + 100 * slot))
export BERTH_TEST_REGISTRY_PORT=$((15000 + 100 * slot)) BERTH_TEST_TOKEN_REGISTRY_PORT=$((15001 + 100 * slot))
export BERTH_TEST_TOKEN_SERVER_PORT=$((15002 + 100 * slot))
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

STATE=/var/lib/$BERTH_TEST_NAME
PREFIX=$STATE/prefix

install_berth() {
    source tests/harness/rust-env.sh
    make install PREFIX="$PREFIX" TARGET_DIR="$CARGO_TARGET_DIR"
}

case $verb in
up)
    tests/harness/install-deps.sh
    install_berth
    tests/harness/registry.sh up
    source tests/harness/lib.sh >/dev/null
    BERTH_PLUGSTACK_LINE=$(test_plugstack_line "$PREFIX" "$STATE")
export BERTH_PLUGSTACK_LINE
    tests/harness/cluster.sh up
    tests/harness/images.sh build
    tests/harness/images.sh push
    tests/harness/entrypoint-images.sh
    tests/harness/engines.sh up
    echo "up: source /run/$BERTH_TEST_NAME/env for SLURM_CONF; tests/dev.sh $slot test --test suite -- MODULE::"
    ;;
install)
    install_berth
    ;;
test)
    source tests/harness/rust-env.sh
    export BERTH_TEST_ENV=/run/$BERTH_TEST_NAME/env BERTH_REQUIRE_CLUSTER=1
    cargo test --release --locked "$@"
    ;;
down)
    tests/harness/engines.sh down || true
    tests/harness/cluster.sh down || true
    tests/harness/registry.sh down || true
    ;;
*)
    echo "unknown verb '$verb' (up, install, test, down)" >&2
    exit 2
    ;;
esac
