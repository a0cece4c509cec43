#!/usr/bin/env bash
# Usage: tests/release.sh SUITE...     (as root; SUITE: trixie, sid)
#
# Runs berth's core cluster suite (tests/run.sh with BERTH_TEST_SUITE=core)
# against the Slurm of another Debian release: trixie ships Slurm 24.11, sid
# 26.05. Each runs in a root of that release (tests/harness/release-root.sh,
# built once and cached), where berth is built against that Slurm's headers,
# with a four-node cluster, registries and images of its own (instance
# berthtest-SUITE, its own /24 and ports), torn down at the end like
# tests/run.sh's. Each root builds into a target folder of its own
# (target/root-SUITE): build scripts linked against a newer glibc cannot run
# on this machine, and cargo would reuse them from a shared folder.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
(($#)) || set -- trixie sid
[[ $(id -u) -eq 0 ]] || { echo "tests/release.sh must run as root" >&2; exit 1; }

index=0
for suite in "$@"; do
    # Slurm 24.11.0 to 24.11.6 run a site TaskProlog through a re-exec of
    # slurmstepd inside the task's mount namespace, the container, where
    # slurmstepd does not exist (status 127; fixed in 24.11.7): trixie's
    # 24.11.5 cluster runs without the harness's TaskProlog
    # (docs/COMPATIBILITY.md).
    prolog=harness
    case $suite in
    trixie) index=20 prolog=none ;;
    sid) index=21 ;;
    *) echo "unknown release root '$suite' (trixie, sid)" >&2; exit 2 ;;
    esac
    t0=$SECONDS
    tests/harness/release-root.sh "$suite" build
    tests/harness/release-root.sh "$suite" enter env \
        BERTH_TEST_NAME="berthtest-$suite" BERTH_TEST_SUITE=core BERTH_TEST_TASK_PROLOG=$prolog \
        BERTH_TEST_SUBNET="10.77.$index" BERTH_TEST_SLOT=0 \
        BERTH_TEST_SLURMCTLD_PORT=$((16817 + 100 * index)) BERTH_TEST_SLURMD_PORT=$((16818 + 100 * index)) \
        BERTH_TEST_REGISTRY_PORT=$((15000 + 100 * index)) BERTH_TEST_TOKEN_REGISTRY_PORT=$((15001 + 100 * index)) \
        BERTH_TEST_TOKEN_SERVER_PORT=$((15002 + 100 * index)) \
        CARGO_TARGET_DIR="$REPO/target/root-$suite" \
        BERTH_TEST_CACHE_DIR="${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/images-$suite" \
        tests/run.sh
    printf '[release] %s: core suite passed in %ds\n' "$suite" $((SECONDS - t0))
done
