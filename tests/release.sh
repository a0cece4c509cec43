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
# compiled), and the test binary (tests/suite) is built once for all releases
# (they drive srun and sbatch; they do not load the plugin). Programs linked
# against this machine's glibc run on the roots' newer one. The target folder
# must lie inside the checkout, which the root sees at the same path.
#
# The same build is packaged here too (packaging/deb.sh, two versions, into
# CARGO_TARGET_DIR/slurm-SUITE/debs): the root's core suite installs the
# release's package and upgrades it under a running job (tests/suite/package.rs).
#
# BERTH_RELEASE_PARALLEL=1 runs the roots at once (tests/run.sh does), each
# line of output prefixed with its release; the default is one after the other.
#
# BERTH_RELEASE_SITE: the cluster the roots run, `gpu` (the default: the
# GPU site of tests/harness/cluster.sh, proctrack/task cgroup with
# ConstrainDevices, fake GRES GPUs, job_container/tmpfs or, on 25.11+,
# namespace/tmpfs, where the core suite runs and cluster_gpu with it, on one
# cluster) or `plain` (linuxproc, task/none). BERTH_RELEASE_CONTAIN_SPANK=yes adds
# SlurmdParameters=contain_spank to every root's cluster (the GPU site), a
# list of roots ("trixie") to theirs only; tests/run.sh runs trixie with it. BERTH_RELEASE_INDEX (default 20) is the third octet of the
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
source tests/harness/release-lib.sh
target=${CARGO_TARGET_DIR:-$REPO/target}
case $(realpath -m "$target")/ in
"$REPO"/*) ;;
*) echo "CARGO_TARGET_DIR ($target) must lie inside the checkout ($REPO): the release roots see only the checkout" >&2; exit 2 ;;
esac

site=${BERTH_RELEASE_SITE:-gpu}
contain_spank=${BERTH_RELEASE_CONTAIN_SPANK:-no}
base=${BERTH_RELEASE_INDEX:-20}
[[ $site == gpu || $site == plain ]] || { echo "BERTH_RELEASE_SITE must be gpu or plain (got '$site')" >&2; exit 2; }
for word in $contain_spank; do
    case $word in
    yes | no | trixie | sid) ;;
    *) echo "BERTH_RELEASE_CONTAIN_SPANK must be yes, no or a list of release roots (got '$contain_spank')" >&2; exit 2 ;;
    esac
done
# contain_spank_for SUITE: yes when SUITE's cluster runs with contain_spank.
contain_spank_for() {
    local word
    for word in $contain_spank; do
        [[ $word == yes || $word == "$1" ]] && { echo yes; return; }
    done
    echo no
}
[[ $base =~ ^[0-9]+$ ]] && ((base >= 10 && base <= 250)) || { echo "BERTH_RELEASE_INDEX must be 10..250" >&2; exit 2; }
for suite in "$@"; do
    case $suite in
    trixie | sid) ;;
    *) echo "unknown release root '$suite' (trixie, sid)" >&2; exit 2 ;;
    esac
done

# The test binary, once for every release: a "suite PATH" line
# (BERTH_CORE_BINARIES: a list tests/run.sh made already).
binaries=${BERTH_CORE_BINARIES:-$target/release-core-tests.txt}
build_tests() {
    [[ -z ${BERTH_CORE_BINARIES:-} ]] || return 0
    log "building the test binary"
    core_binaries "$target" >"$binaries.tmp"
    mv "$binaries.tmp" "$binaries"
}

# build_berth SUITE: berth (plugin and CLI) against SUITE's Slurm headers.
build_berth() {
    local suite=$1 root
    root=$(tests/harness/release-root.sh "$suite" path)
    build_berth_with_headers "$target/slurm-$suite" "$root/usr/include/slurm" \
        "$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${Version}' libslurm-dev) ($suite)"
}

# build_debs SUITE: two versions of SUITE's Debian package, here, from what
# build_berth built (the package test installs and upgrades them in the root);
# prints FIRST.deb:SECOND.deb.
build_debs() {
    local suite=$1 dir=$target/slurm-$1 first second
    rm -rf "$dir/debs"
    first=$(BERTH_DEB_PREBUILT=1 SLURM_INCLUDE_DIR=$dir/include BERTH_DEB_VERSION=0.1.0~ci1 TARGET_DIR=$dir packaging/deb.sh "$dir/debs/1")
    second=$(BERTH_DEB_PREBUILT=1 SLURM_INCLUDE_DIR=$dir/include BERTH_DEB_VERSION=0.1.0~ci2 TARGET_DIR=$dir packaging/deb.sh "$dir/debs/2")
    log "$suite: Debian packages, Depends: $(dpkg-deb -f "$first" Depends)" >&2
    echo "$first:$second"
}

# run_suite SUITE: the core suite inside SUITE's root.
run_suite() {
    local suite=$1 index name prolog=harness t0=$SECONDS debs cluster_env
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
    debs=$(build_debs "$suite")
    mapfile -t cluster_env < <(release_cluster_env "$index" "$name")
    tests/harness/release-root.sh "$suite" enter env "${cluster_env[@]}" \
        BERTH_TEST_DEBS="$debs" BERTH_TEST_SUITE=core BERTH_TEST_TASK_PROLOG=$prolog \
        BERTH_TEST_SITE="$site" BERTH_TEST_CONTAIN_SPANK="$(contain_spank_for "$suite")" \
        CARGO_TARGET_DIR="$target/slurm-$suite" BERTH_TEST_BINARIES="$binaries" \
        BERTH_TEST_CACHE_DIR="$cache/images-$suite" \
        tests/run.sh
    log "$suite: core suite ($site site, contain_spank $(contain_spank_for "$suite")) passed in $((SECONDS - t0))s"
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
