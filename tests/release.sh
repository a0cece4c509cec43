#!/usr/bin/env bash
# Usage: tests/release.sh SUITE...     (as root; SUITE: trixie, sid)
#
# Runs berth's core cluster suite (tests/harness/core-suite.sh, through
# tests/run.sh with BERTH_TEST_SUITE=core) against the Slurm of another
# Debian release: trixie ships Slurm 24.11, sid 26.05. Each runs in a root
# of that release (tests/harness/release-root.sh, built once and cached),
# with a four-node cluster, registries and images of its own (instance
# berthtest-SUITE, its own /24 and ports), torn down at the end like
# tests/run.sh's.
#
# Nothing is compiled inside a root. Here, on this machine, berth is built
# against the root's <slurm/spank.h> into CARGO_TARGET_DIR/slurm-SUITE
# (seeded with this machine's compiled dependencies, so only berth itself is
# compiled), and the core test binaries are built once for all releases
# (they drive srun and sbatch; they do not load the plugin). Programs linked
# against this machine's glibc run on the roots' newer one. The target folder
# must lie inside the checkout, which the root sees at the same path.
#
# BERTH_RELEASE_PARALLEL=1 runs the roots at once (tests/run.sh does), each
# line of output prefixed with its release; the default is one after the other.
#
# BERTH_RELEASE_SITE: the cluster the roots run, `gpu` (the default: the
# GPU site of tests/harness/cluster.sh, proctrack/task cgroup with
# ConstrainDevices, fake GRES GPUs, job_container/tmpfs or, on 25.11+,
# namespace/tmpfs, where the core suite runs and cluster_gpu with it, on one
# cluster) or `plain` (linuxproc, task/none). BERTH_RELEASE_CONTAIN_SPANK=yes adds
# SlurmdParameters=contain_spank, under which berth refuses containers. BERTH_RELEASE_INDEX (default 20) is the third octet of the
# first root's /24 (the next root takes the next one), also the offset of its
# ports and the name: a developer's run beside CI's picks another one.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
(($#)) || set -- trixie sid
[[ $(id -u) -eq 0 ]] || { echo "tests/release.sh must run as root" >&2; exit 1; }
log() { printf '[release] %s\n' "$*"; }

# What the caller's own cluster exported (tests/run.sh starts this script)
# must not reach the roots' clusters.
cache=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
while read -r var; do
    unset "$var"
done < <(compgen -e | grep -E '^(BERTH_TEST_|BERTH_PLUGSTACK_|BERTH_REQUIRE_|SLURM_)' || true)
export BERTH_TEST_CACHE_DIR=$cache

source tests/harness/rust-env.sh
source tests/harness/core-suite.sh
target=${CARGO_TARGET_DIR:-$REPO/target}
case $(realpath -m "$target")/ in
"$REPO"/*) ;;
*) echo "CARGO_TARGET_DIR ($target) must lie inside the checkout ($REPO): the release roots see only the checkout" >&2; exit 2 ;;
esac

site=${BERTH_RELEASE_SITE:-gpu}
contain_spank=${BERTH_RELEASE_CONTAIN_SPANK:-no}
base=${BERTH_RELEASE_INDEX:-20}
[[ $site == gpu || $site == plain ]] || { echo "BERTH_RELEASE_SITE must be gpu or plain (got '$site')" >&2; exit 2; }
[[ $contain_spank == yes || $contain_spank == no ]] || { echo "BERTH_RELEASE_CONTAIN_SPANK must be yes or no" >&2; exit 2; }
[[ $base =~ ^[0-9]+$ ]] && ((base >= 10 && base <= 250)) || { echo "BERTH_RELEASE_INDEX must be 10..250" >&2; exit 2; }
for suite in "$@"; do
    case $suite in
    trixie | sid) ;;
    *) echo "unknown release root '$suite' (trixie, sid)" >&2; exit 2 ;;
    esac
done

# The core test binaries, once for every release: "NAME PATH" lines
# (BERTH_CORE_BINARIES: a list tests/run.sh made already).
binaries=${BERTH_CORE_BINARIES:-$target/release-core-tests.txt}
build_tests() {
    [[ -z ${BERTH_CORE_BINARIES:-} ]] || return 0
    log "building the core test binaries"
    core_binaries "$target" >"$binaries.tmp"
    mv "$binaries.tmp" "$binaries"
}

# build_berth SUITE: berth (plugin and CLI) against SUITE's Slurm headers.
build_berth() {
    local suite=$1 dir=$target/slurm-$1 root
    root=$(tests/harness/release-root.sh "$suite" path)
    # Only the root's Slurm headers: the C library's come from this machine,
    # which compiles and links.
    mkdir -p "$dir/include"
    ln -sfn "$root/usr/include/slurm" "$dir/include/slurm"
    if [[ ! -d $dir/release/deps && -d $target/release/deps ]]; then
        log "$suite: seeding $dir with this machine's compiled dependencies"
        mkdir -p "$dir/release"
        cp -a "$target/release/deps" "$target/release/build" "$target/release/.fingerprint" "$dir/release/"
    fi
    log "$suite: building berth against Slurm $(dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${Version}' libslurm-dev)"
    SLURM_INCLUDE_DIR=$dir/include cargo build --release --locked --target-dir "$dir"
}

# run_suite SUITE: the core suite inside SUITE's root.
run_suite() {
    local suite=$1 index name prolog=harness t0=$SECONDS
    case $suite in
    # Both run the harness's TaskProlog: on 23.11 and later berth's tasks
    # enter the container by exec, after Slurm ran the TaskProlog on the host
    # (which 24.11.0 to 24.11.6 could not do inside a container).
    trixie) index=$base ;;
    sid) index=$((base + 1)) ;;
    esac
    name=berthtest-$suite
    ((base == 20)) || name+=-$base
    tests/harness/release-root.sh "$suite" build
    build_berth "$suite"
    tests/harness/release-root.sh "$suite" enter env \
        BERTH_TEST_NAME="$name" BERTH_TEST_SUITE=core BERTH_TEST_TASK_PROLOG=$prolog \
        BERTH_TEST_SITE="$site" BERTH_TEST_CONTAIN_SPANK="$contain_spank" \
        BERTH_TEST_SUBNET="10.77.$index" BERTH_TEST_SLOT=0 \
        BERTH_TEST_SLURMCTLD_PORT=$((16817 + 100 * index)) BERTH_TEST_SLURMD_PORT=$((16818 + 100 * index)) \
        BERTH_TEST_REGISTRY_PORT=$((15000 + 100 * index)) BERTH_TEST_TOKEN_REGISTRY_PORT=$((15001 + 100 * index)) \
        BERTH_TEST_TOKEN_SERVER_PORT=$((15002 + 100 * index)) \
        CARGO_TARGET_DIR="$target/slurm-$suite" BERTH_TEST_BINARIES="$binaries" \
        BERTH_TEST_CACHE_DIR="$cache/images-$suite" \
        tests/run.sh
    log "$suite: core suite ($site site) passed in $((SECONDS - t0))s"
}

t0=$SECONDS
build_tests
if [[ ${BERTH_RELEASE_PARALLEL:-0} == 1 ]]; then
    pids=()
    for suite in "$@"; do
        {
            run_suite "$suite" 2>&1 | sed -u "s/^/[$suite] /"
            exit "${PIPESTATUS[0]}"
        } &
        pids+=($!)
    done
    rc=0
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=1; log "${*:i+1:1}: FAILED"; }
    done
    log "releases $* done in $((SECONDS - t0))s (exit $rc)"
    exit $rc
fi
for suite in "$@"; do
    run_suite "$suite"
done
log "releases $* passed in $((SECONDS - t0))s"
