#!/usr/bin/env bash
# Usage: tests/run.sh   (as root)
#
# berth's test command (README, .ci/run). On a fresh Debian 12 machine it:
#   1. installs what is missing (tests/harness/install-deps.sh),
#   2. checks formatting and lints (cargo fmt, clippy), that the CLI builds
#      without the plugin, then builds berth and installs it under a
#      private prefix,
#   3. starts a registry and a four-node Slurm cluster of its own
#      (tests/harness; names from BERTH_TEST_NAME, default berthtest-ci),
#      builds the test images (cached between runs) and pushes them,
#   4. runs the unit tests, then the integration tests against the cluster
#      (srun/sbatch as root and as the ordinary user berthuser), then the
#      leftover check alone, then the GPU-site tests (cluster_gpu,
#      cluster_site, cluster_faults' scancel tests) on the cluster
#      restarted with BERTH_TEST_SITE=gpu,
#   5. tears the cluster and registry down, whatever happened.
#
# Environment: BERTH_TEST_NAME, BERTH_TEST_NODES (see tests/harness/lib.sh),
# BERTH_KEEP_CLUSTER=1 to leave the cluster running for debugging.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthtest-ci}
# full: every suite, then the core suite on the Slurm of each release root
# (BERTH_TEST_RELEASES); core: the cluster suites that depend on Slurm's
# behaviour (what tests/release.sh runs inside a release root).
SUITE=${BERTH_TEST_SUITE:-full}
[[ $SUITE == full || $SUITE == core ]] || { echo "BERTH_TEST_SUITE must be full or core (got '$SUITE')" >&2; exit 2; }
# Four nodes: node1 and node2 form the default partition (the tests written
# for two nodes), all four the partition `wide` (tests/cluster_fanout.rs).
export BERTH_TEST_NODES=${BERTH_TEST_NODES:-4} BERTH_TEST_DEFAULT_NODES=${BERTH_TEST_DEFAULT_NODES:-2}
# Built test images are cached here between runs (shared with demo.sh).
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
# Tests must not pick up a cluster configuration from the caller.
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

log() { printf '[tests] %s\n' "$*"; }
[[ $(id -u) -eq 0 ]] || { echo "tests/run.sh must run as root (it starts a Slurm cluster)" >&2; exit 1; }

t0=$SECONDS
tests/harness/install-deps.sh
source tests/harness/rust-env.sh

STATE=/var/lib/$BERTH_TEST_NAME
PREFIX=$STATE/prefix
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}

if [[ $SUITE == full ]]; then
    # First, before anything slow: a formatting or lint failure stops the
    # run within a minute or two, saying what to run.
    log "formatting and lints"
    berth_rust_linters
    cargo fmt --check || {
        echo "[tests] FAILED: cargo fmt --check (the diff above): run cargo fmt, commit, run again" >&2
        exit 1
    }
    cargo clippy --locked --all-targets -- -D warnings || {
        echo "[tests] FAILED: cargo clippy --all-targets -- -D warnings (the warnings above): fix them, run again" >&2
        exit 1
    }
    cargo clippy --locked --all-targets --no-default-features -- -D warnings || {
        echo "[tests] FAILED: cargo clippy --all-targets --no-default-features -- -D warnings: fix the warnings above" >&2
        exit 1
    }
    # The CLI alone, as on a machine without Slurm's headers: without the
    # default feature `spank` bindgen is not even built, so no header is read.
    log "the CLI without the SPANK plugin (--no-default-features)"
    if cargo tree --locked --no-default-features -e normal,build -i bindgen >/dev/null 2>&1; then
        echo "bindgen is still built with --no-default-features (build.rs needs the feature)" >&2
        exit 1
    fi
    SLURM_INCLUDE_DIR=/nonexistent cargo check --locked --no-default-features --bin berth
fi

log "building and installing berth under $PREFIX"
make install PREFIX="$PREFIX" TARGET_DIR="$CARGO_TARGET_DIR"

teardown() {
    local rc=$?
    if [[ ${BERTH_KEEP_CLUSTER:-0} == 1 ]]; then
        log "leaving the cluster running (BERTH_KEEP_CLUSTER=1); stop it with:"
        log "  BERTH_TEST_NAME=$BERTH_TEST_NAME tests/harness/cluster.sh down; BERTH_TEST_NAME=$BERTH_TEST_NAME tests/harness/registry.sh down"
    else
        "$REPO"/tests/harness/engines.sh down >/dev/null 2>&1 || true
        "$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1 || true
        "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1 || true
    fi
    log "finished in $((SECONDS - t0))s (exit $rc)"
}
trap teardown EXIT

tests/harness/registry.sh up
source tests/harness/lib.sh >/dev/null
BERTH_PLUGSTACK_LINE=$(test_plugstack_line "$PREFIX" "$STATE")
export BERTH_PLUGSTACK_LINE
tests/harness/cluster.sh up
tests/harness/images.sh build
tests/harness/images.sh push
tests/harness/entrypoint-images.sh
tests/harness/engines.sh up

export BERTH_TEST_ENV=/run/$BERTH_TEST_NAME/env
export BERTH_REQUIRE_CLUSTER=1
if [[ $SUITE == core ]]; then
    log "core integration tests against Slurm $(slurmd -V 2>/dev/null | awk '{print $2}')"
    # Two tests bind this machine's own programs into the bookworm test images
    # (srun in a batch container, the host's MPICH): they need this
    # machine's glibc to be no newer than the images' (2.36), which a newer
    # release root's is not.
    skips=(--skip srun_in_a_containerized_batch_script_inherits_or_overrides
        --skip host_mpich_is_injected_and_runs_over_pmi2_across_nodes)
    # Debian's Slurm 26.05 (sid) is built without the mpi/pmix plugin.
    if ! SLURM_CONF=$SLURM_CONF_FILE srun --mpi=list 2>&1 | grep -qw pmix; then
        log "this Slurm has no mpi/pmix plugin: the PMIx tests are skipped"
        skips+=(--skip pmix_mpi_allreduce_across_nodes --skip open_mpi_over_pmix_still_works_beside_profiles)
    fi
    cargo test --release --locked --no-fail-fast --test cluster --test cluster_entry --test cluster_named \
        --test cluster_mpi --test cluster_pin --test cluster_private --test cluster_fanout -- --test-threads=2 \
        "${skips[@]}"
    cargo test --release --locked --test cluster_faults -- killed_helper_or_task_leaves_nothing_behind scancel_at_each_stage
    log "leftover check (alone, after every other test)"
    cargo test --release --locked --test cluster_leftovers
    exit 0
fi
log "unit and integration tests"
cargo build --release --locked --examples
# Every test binary now, so the later runs (package, leftovers) build nothing.
cargo test --release --locked --no-run --test package --test cluster_leftovers --test cluster_shared --test cluster_gpu
cargo test --release --locked --no-fail-fast --lib --bins --test container_runtime --test container_join \
    --test store_cli --test cli --test cluster --test cluster_entry --test cluster_named --test umoci_equivalence --test fuzz_smoke --test security --test doctor \
    --test cluster_mpi --test gpu_inject --test cluster_pull --test cluster_fanout --test cluster_pin --test cluster_faults --test cluster_private --test cluster_site --test cluster_shapes --test cluster_origin --test cluster_ipc --test security_mounts --test security_ldconfig --test security_store --test cluster_apt --test cluster_join --test cluster_relative_mounts --test cluster_userfile --test cluster_carried --test cluster_enroot_site --test cluster_archive -- --test-threads=2
log "shared store (alone: it points the drop-in at a shared store)"
cargo test --release --locked --test cluster_shared
log "Debian package: two versions, installed and upgraded under a running job (alone: it switches the drop-in)"
debs=$STATE/debs
rm -rf "$debs"
deb1=$(BERTH_DEB_VERSION=0.1.0~ci1 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/1")
deb2=$(BERTH_DEB_VERSION=0.1.0~ci2 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/2")
BERTH_TEST_DEBS=$deb1:$deb2 cargo test --release --locked --test package
log "leftover check (alone, after every other test)"
cargo test --release --locked --test cluster_leftovers
log "GPU site: the cluster again with proctrack/task cgroup, ConstrainDevices, job_container/tmpfs and fake GPUs"
tests/harness/cluster.sh down
BERTH_TEST_SITE=gpu tests/harness/cluster.sh up
cargo test --release --locked --test cluster_gpu --test cluster_site -- --test-threads=2
# scancel under proctrack/cgroup: the step's helpers, what the cancel
# watcher still has to stop (issue 19 point 6).
cargo test --release --locked --test cluster_faults -- scancel
cargo test --release --locked --test cluster_leftovers
