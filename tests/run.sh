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
#   5. meanwhile, once the integration tests are done, runs the core suite
#      on the Slurm of each release root (BERTH_TEST_RELEASES, default
#      "trixie sid": Slurm 24.11 and 26.05) with tests/release.sh, both
#      roots at once, each with a cluster of its own on the GPU site (so
#      cluster_gpu runs there too), trixie's with contain_spank
#      (BERTH_RELEASE_CONTAIN_SPANK, default "trixie"),
#   6. tears the cluster and registry down, whatever happened (and waits
#      for the release roots, which tear down their own).
#
# Environment: BERTH_TEST_NAME, BERTH_TEST_NODES (see tests/harness/lib.sh),
# BERTH_TEST_RELEASES (empty: 22.05 only), BERTH_KEEP_CLUSTER=1 to leave the
# cluster running for debugging.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthtest-ci}
# full: every suite, and the core suite on the Slurm of each release root
# (BERTH_TEST_RELEASES); core: the cluster suites that depend on Slurm's
# behaviour (tests/harness/core-suite.sh; what tests/release.sh runs inside
# a release root).
SUITE=${BERTH_TEST_SUITE:-full}
[[ $SUITE == full || $SUITE == core ]] || { echo "BERTH_TEST_SUITE must be full or core (got '$SUITE')" >&2; exit 2; }
RELEASES=${BERTH_TEST_RELEASES-trixie sid}
[[ $SUITE == full ]] || RELEASES=""
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

if [[ -n ${BERTH_TEST_BINARIES:-} ]]; then
    # In a release root: tests/release.sh built berth against this Slurm's
    # headers outside the root, and the test binaries (BERTH_TEST_BINARIES).
    log "installing berth (built outside the root) under $PREFIX"
    make install-built PREFIX="$PREFIX" TARGET_DIR="$CARGO_TARGET_DIR"
else
    log "building and installing berth under $PREFIX"
    make install PREFIX="$PREFIX" TARGET_DIR="$CARGO_TARGET_DIR"
fi

release_pid=""
RELEASE_LOG=$STATE/releases.log
# wait_releases: waits for the release roots' run and shows its log; fails
# when it failed.
wait_releases() {
    [[ -n $release_pid ]] || return 0
    local rc=0 pid=$release_pid
    release_pid=""
    log "waiting for the release roots ($RELEASES)"
    wait "$pid" || rc=$?
    cat "$RELEASE_LOG"
    ((rc == 0)) || echo "[tests] FAILED: the core suite on a release root (tests/release.sh $RELEASES; log above, $RELEASE_LOG)" >&2
    return $rc
}

teardown() {
    local rc=$?
    wait_releases || rc=1
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
# The local Docker daemon and podman stores serve the full suite's archive
# tests only (no core test uses them; dockerd does not come up in a root).
[[ $SUITE == core ]] || tests/harness/engines.sh up

export BERTH_TEST_ENV=/run/$BERTH_TEST_NAME/env
export BERTH_REQUIRE_CLUSTER=1
source tests/harness/core-suite.sh
# core_run NAME... -- ARGS...: the test binaries NAME, each with ARGS, through
# cargo or (in a release root) from the list BERTH_TEST_BINARIES of
# "NAME PATH" lines that tests/release.sh built outside the root.
core_run() {
    local names=() name bin rc=0
    while [[ $1 != -- ]]; do
        names+=("$1")
        shift
    done
    shift
    if [[ -z ${BERTH_TEST_BINARIES:-} ]]; then
        local flags=()
        for name in "${names[@]}"; do flags+=(--test "$name"); done
        cargo test --release --locked --no-fail-fast "${flags[@]}" -- "$@"
        return
    fi
    for name in "${names[@]}"; do
        bin=$(awk -v n="$name" '$1 == n {print $2}' "$BERTH_TEST_BINARIES")
        [[ -n $bin && -x $bin ]] || {
            echo "[tests] no test binary '$name' in $BERTH_TEST_BINARIES (run tests/release.sh)" >&2
            return 1
        }
        log "$name ($bin $*)"
        "$bin" "$@" || rc=1
    done
    return $rc
}

if [[ $SUITE == core ]]; then
    log "core integration tests against Slurm $(slurmd -V 2>/dev/null | awk '{print $2}')"
    skips=()
    for name in "${CORE_GLIBC_TESTS[@]}"; do skips+=(--skip "$name"); done
    if ! SLURM_CONF=$SLURM_CONF_FILE srun --mpi=list 2>&1 | grep -qw pmix; then
        log "this Slurm has no mpi/pmix plugin: the PMIx tests are skipped"
        for name in "${CORE_PMIX_TESTS[@]}"; do skips+=(--skip "$name"); done
    fi
    failed=()
    core_run "${CORE_TESTS[@]}" -- --test-threads=2 "${skips[@]}" || failed+=("${CORE_TESTS[*]}")
    for entry in "${CORE_FILTERED[@]}"; do
        read -ra filters <<<"${entry#*=}"
        core_run "${entry%%=*}" -- "${filters[@]}" || failed+=("$entry")
    done
    if [[ ${BERTH_TEST_SITE:-plain} == gpu ]]; then
        log "GPU site: $(grep -E '^(SlurmdParameters|JobContainerType|NamespaceType)=' "$SLURM_CONF_FILE" | tr '\n' ' ')"
        core_run "${CORE_GPU_TESTS[@]}" -- --test-threads=2 || failed+=("${CORE_GPU_TESTS[*]}")
    fi
    if [[ -n ${BERTH_TEST_DEBS:-} ]]; then
        log "Debian package of this release: installed and upgraded under a running job (alone)"
        core_run "$CORE_PACKAGE" -- || failed+=("$CORE_PACKAGE")
    fi
    log "leftover check (alone, after every other test)"
    core_run "$CORE_LAST" -- || failed+=("$CORE_LAST")
    ((${#failed[@]} == 0)) || { echo "[tests] FAILED (core suite): ${failed[*]}" >&2; exit 1; }
    exit 0
fi
log "unit and integration tests"
cargo build --release --locked --examples
# Every test binary now, so the later runs (package, leftovers) build nothing.
cargo test --release --locked --no-run --test package --test cluster_leftovers --test cluster_shared --test cluster_gpu
cargo test --release --locked --no-fail-fast --lib --bins --test container_runtime --test container_join \
    --test store_cli --test cli --test cluster --test cluster_entry --test cluster_named --test umoci_equivalence --test fuzz_smoke --test security --test doctor \
    --test cluster_mpi --test gpu_inject --test cluster_pull --test cluster_fanout --test cluster_pin --test cluster_faults --test cluster_private --test cluster_site --test cluster_shapes --test cluster_origin --test cluster_ipc --test security_mounts --test security_ldconfig --test security_store --test cluster_apt --test cluster_join --test cluster_relative_mounts --test cluster_userfile --test cluster_carried --test cluster_enroot_site --test cluster_enroot_hooks --test cluster_archive -- --test-threads=2 || main_failed=1
if [[ -n $RELEASES ]]; then
    # From here on the 22.05 tests look at their own cluster only (the
    # leftover checks too), so the roots' clusters may run beside them.
    log "release roots ($RELEASES): the core suite on their Slurm, in the background (log: $RELEASE_LOG)"
    # The list of test binaries first, here: cargo runs that follow in this
    # script hold the target folder's lock while their tests run.
    core_list=$CARGO_TARGET_DIR/release-core-tests.txt
    core_binaries "$CARGO_TARGET_DIR" >"$core_list"
    # shellcheck disable=SC2086  # one word per release
    # trixie's cluster runs with SlurmdParameters=contain_spank (24.05+), sid's
    # without: both ways of running SPANK's callbacks are tested on a new Slurm.
    BERTH_RELEASE_CONTAIN_SPANK=${BERTH_RELEASE_CONTAIN_SPANK-trixie} \
        BERTH_CORE_BINARIES=$core_list BERTH_RELEASE_PARALLEL=1 tests/release.sh $RELEASES >"$RELEASE_LOG" 2>&1 &
    release_pid=$!
fi
# A failure above ends the run, once the release roots' suites are done too.
[[ -z ${main_failed:-} ]] || { echo "[tests] FAILED: the unit and integration tests (above)" >&2; exit 1; }
log "shared store (alone: it points the drop-in at a shared store)"
cargo test --release --locked --test cluster_shared
log "Debian package: two versions, installed and upgraded under a running job (alone: it switches the drop-in); the RPM's contents"
debs=$STATE/debs
rm -rf "$debs"
deb1=$(BERTH_DEB_VERSION=0.1.0~ci1 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/1")
deb2=$(BERTH_DEB_VERSION=0.1.0~ci2 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/2")
# The RPM (packaging/berth.spec) from the same build: rpmbuild compiles nothing.
rpm=$(BERTH_RPM_NODEPS=1 TARGET_DIR="$CARGO_TARGET_DIR" packaging/rpm.sh "$STATE/rpm" 2>"$STATE/rpmbuild.log") ||
    { cat "$STATE/rpmbuild.log" >&2; echo "[tests] FAILED: packaging/rpm.sh" >&2; exit 1; }
BERTH_TEST_DEBS=$deb1:$deb2 BERTH_TEST_RPM=$rpm cargo test --release --locked --test package
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
wait_releases
