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
# for two nodes), all four the partition `wide` (tests/suite/cluster_fanout.rs).
export BERTH_TEST_NODES=${BERTH_TEST_NODES:-4} BERTH_TEST_DEFAULT_NODES=${BERTH_TEST_DEFAULT_NODES:-2}
# Built test images are cached here between runs (shared with demo.sh).
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
# Tests must not pick up a cluster configuration from the caller.
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

log() { printf '[tests] %s\n' "$*"; }
[[ $(id -u) -eq 0 ]] || { echo "tests/run.sh must run as root (it starts a Slurm cluster)" >&2; exit 1; }

# The modules of tests/suite (one test binary) the full suite runs one after
# another (core_run), and those it runs alone (they switch the drop-in or
# the cluster). Every module of tests/suite/main.rs must be in one of them.
MAIN_MODULES=(container_runtime container_join store_cli berth_cli cluster cluster_entry cluster_named
    umoci_equivalence fuzz_smoke security doctor cluster_mpi gpu_inject cluster_pull cluster_fanout
    cluster_pin cluster_faults cluster_private cluster_site cluster_shapes cluster_origin cluster_ipc
    security_mounts security_ldconfig security_store cluster_apt cluster_join cluster_relative_mounts
    cluster_userfile cluster_carried cluster_enroot_site cluster_enroot_hooks cluster_archive)
ALONE_MODULES=(cluster_shared package cluster_leftovers cluster_gpu)
unrun=$(comm -23 <(sed -n 's/^mod \([a-z0-9_]*\);$/\1/p' tests/suite/main.rs | grep -vx common | sort) \
    <(printf '%s\n' "${MAIN_MODULES[@]}" "${ALONE_MODULES[@]}" | sort))
[[ -z $unrun ]] || {
    echo "[tests] FAILED: tests/suite modules no run names: $unrun (add them to MAIN_MODULES in tests/run.sh)" >&2
    exit 1
}

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
# suite_run FILTER... -- ARGS...: the one test binary (tests/suite) with
# these filters (a test runs when its name holds one of them) and ARGS,
# through cargo or, in a release root, the binary that the "suite PATH"
# line of BERTH_TEST_BINARIES names (tests/release.sh built it outside the
# root).
suite_run() {
    local filters=() bin
    while [[ $1 != -- ]]; do
        filters+=("$1")
        shift
    done
    shift
    if [[ -z ${BERTH_TEST_BINARIES:-} ]]; then
        cargo test --release --locked --test suite -- "${filters[@]}" "$@"
        return
    fi
    bin=$(awk '$1 == "suite" {print $2}' "$BERTH_TEST_BINARIES")
    [[ -n $bin && -x $bin ]] || {
        echo "[tests] no test binary 'suite' in $BERTH_TEST_BINARIES (run tests/release.sh)" >&2
        return 1
    }
    log "${filters[*]} ($bin $*)"
    "$bin" "${filters[@]}" "$@"
}

# core_run MODULE... -- ARGS...: each test module (a file of tests/suite)
# with ARGS, one module after another, so that the tests of one never run
# beside another's (each changes the cluster its own way); every module
# runs, and the call fails when one failed.
core_run() {
    local modules=() module rc=0
    while [[ $1 != -- ]]; do
        modules+=("$1")
        shift
    done
    shift
    for module in "${modules[@]}"; do
        suite_run "$module::" -- "$@" || rc=1
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
        suite_run "${filters[@]/#/${entry%%=*}::}" -- || failed+=("$entry")
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
# The test binary now, so the later runs (package, leftovers) build nothing.
cargo test --release --locked --no-run --test suite
cargo test --release --locked --no-fail-fast --lib --bins -- --test-threads=2 || main_failed=1
core_run "${MAIN_MODULES[@]}" -- --test-threads=2 || main_failed=1
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
core_run cluster_shared --
log "Debian package: two versions, installed and upgraded under a running job (alone: it switches the drop-in); the RPM's contents"
debs=$STATE/debs
rm -rf "$debs"
deb1=$(BERTH_DEB_VERSION=0.1.0~ci1 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/1")
deb2=$(BERTH_DEB_VERSION=0.1.0~ci2 TARGET_DIR="$CARGO_TARGET_DIR" packaging/deb.sh "$debs/2")
# The RPM (packaging/berth.spec) from the same build: rpmbuild compiles nothing.
rpm=$(BERTH_RPM_NODEPS=1 TARGET_DIR="$CARGO_TARGET_DIR" packaging/rpm.sh "$STATE/rpm" 2>"$STATE/rpmbuild.log") ||
    { cat "$STATE/rpmbuild.log" >&2; echo "[tests] FAILED: packaging/rpm.sh" >&2; exit 1; }
BERTH_TEST_DEBS=$deb1:$deb2 BERTH_TEST_RPM=$rpm core_run package --
log "leftover check (alone, after every other test)"
core_run cluster_leftovers --
log "GPU site: the cluster again with proctrack/task cgroup, ConstrainDevices, job_container/tmpfs and fake GPUs"
tests/harness/cluster.sh down
BERTH_TEST_SITE=gpu tests/harness/cluster.sh up
core_run cluster_gpu cluster_site -- --test-threads=2
# scancel under proctrack/cgroup: the step's helpers, what the cancel
# watcher still has to stop (issue 19 point 6).
suite_run cluster_faults::scancel --
core_run cluster_leftovers --
wait_releases
