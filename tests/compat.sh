#!/usr/bin/env bash
# Usage: tests/compat.sh TARBALL...     (as root; a developer's command, not CI's)
#
# Runs berth's core cluster suite (tests/harness/core-suite.sh, as
# tests/release.sh does) against Slurm releases built from source: each
# TARBALL unpacks to opt/slurm-VER (device/slurm-prefixes.sh makes them;
# this machine keeps them in /var/cache/berth-test/slurm-prefixes/). For each,
# one after the other:
#
#   - the tarball is unpacked (once) into CARGO_TARGET_DIR/compat/VER/opt;
#   - berth is built against its include/slurm into
#     CARGO_TARGET_DIR/slurm-compat-VER (one folder per release: reruns are
#     incremental);
#   - the core suite runs in the trixie root (tests/harness/release-root.sh;
#     its C library, munge, PMIx and D-Bus are those the prefixes were built
#     against), that folder bound onto the root's /opt for the run only, and
#     BERTH_TEST_SLURM_PREFIX=/opt/slurm-VER: the harness starts the daemons,
#     srun and sbatch from there, with PluginDir=/opt/slurm-VER/lib/slurm.
#
# Cluster i (from 0) of a run uses index BERTH_COMPAT_INDEX+i (default 60):
# subnet 10.77.INDEX and ports offset by 100 * INDEX, clear of CI's roots (20
# and 21). Each release's output goes to CARGO_TARGET_DIR/compat/VER.log too;
# the summary at the end lists every test result line of each.
# Builds run under `nice -n 10`. Exit status: 0 when every release passed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
(($#)) || { sed -n '2,3p' "$0" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "tests/compat.sh must run as root" >&2; exit 1; }
log() { printf '[compat] %s\n' "$*"; }

cache=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
while read -r var; do
    unset "$var"
done < <(compgen -e | grep -E '^(BERTH_TEST_|BERTH_PLUGSTACK_|BERTH_REQUIRE_|SLURM_)' || true)

source tests/harness/rust-env.sh
source tests/harness/core-suite.sh
source tests/harness/release-lib.sh
# Builds yield to the other work on the machine; the clusters do not.
cargo_bin=$(type -P cargo)
cargo() { nice -n 10 "$cargo_bin" "$@"; }
target=${CARGO_TARGET_DIR:-$REPO/target}
case $(realpath -m "$target")/ in
"$REPO"/*) ;;
*) echo "CARGO_TARGET_DIR ($target) must lie inside the checkout ($REPO): the release root sees only the checkout" >&2; exit 2 ;;
esac
base=${BERTH_COMPAT_INDEX:-60}
[[ $base =~ ^[0-9]+$ ]] && ((base >= 10 && base + $# <= 250)) || { echo "BERTH_COMPAT_INDEX must be 10..250" >&2; exit 2; }
for tarball in "$@"; do
    [[ -f $tarball ]] || { echo "no such tarball: $tarball" >&2; exit 2; }
done

# unpack TARBALL: prints the folder that holds opt/slurm-VER's contents
# (unpacked once; again when the tarball changes).
unpack() {
    local tarball=$1 ver dir stamp
    ver=$(basename "$tarball" .tar.xz)
    dir=$target/compat/$ver
    stamp=$(sha256sum "$tarball" | cut -c1-16)
    if [[ ! -f $dir/.unpacked || $(cat "$dir/.unpacked") != "$stamp" ]]; then
        rm -rf --one-file-system "$dir/opt"
        mkdir -p "$dir/opt"
        tar -C "$dir" -xJf "$tarball"
        echo "$stamp" >"$dir/.unpacked"
    fi
    echo "$dir"
}

# run_release TARBALL INDEX: the core suite against one release.
run_release() {
    local tarball=$1 index=$2 dir prefix ver cred t0=$SECONDS cluster_env rc=0
    dir=$(unpack "$tarball") || return 1
    prefix=$(find "$dir/opt" -mindepth 1 -maxdepth 1 -name 'slurm-*' -type d | head -1)
    [[ -n $prefix && -f $prefix/include/slurm/spank.h ]] ||
        { echo "$tarball holds no opt/slurm-VER with include/slurm/spank.h" >&2; return 1; }
    ver=${prefix##*/}
    # Debian builds Slurm with --enable-multiple-slurmd (its slurmd names
    # itself slurmd-NODE in syslog); a build without it needs cred/none on
    # a cluster whose nodes share one munged (tests/harness/lib.sh).
    cred=cred/munge
    if ! grep -qaF 'slurmd-%s' "$prefix/sbin/slurmd"; then
        cred=cred/none
        log "$ver: built without --enable-multiple-slurmd: the cluster runs CredType=cred/none"
    fi
    build_berth_with_headers "$target/slurm-compat-${ver#slurm-}" "$prefix/include/slurm" \
        "${ver#slurm-} (built from source)" || return 1
    mapfile -t cluster_env < <(release_cluster_env "$index" "berthtest-c$index")
    BERTH_RELEASE_ROOT_OPT=$dir/opt tests/harness/release-root.sh trixie enter env "${cluster_env[@]}" \
        BERTH_TEST_SUITE=core BERTH_TEST_TASK_PROLOG=harness BERTH_TEST_SITE=plain \
        BERTH_TEST_SLURM_PREFIX="/opt/$ver" BERTH_TEST_CRED_TYPE=$cred \
        CARGO_TARGET_DIR="$target/slurm-compat-${ver#slurm-}" BERTH_TEST_BINARIES="$binaries" \
        BERTH_TEST_CACHE_DIR="$cache/images-compat" \
        tests/run.sh || rc=$?
    log "$ver: core suite exit $rc in $((SECONDS - t0))s"
    return $rc
}

tests/harness/release-root.sh trixie build
# The images the tests pull, cached apart from CI's roots' (which may run
# beside this): seeded once from the trixie root's cache.
if [[ ! -d $cache/images-compat && -d $cache/images-trixie ]]; then
    cp -a "$cache/images-trixie" "$cache/images-compat.tmp"
    mv "$cache/images-compat.tmp" "$cache/images-compat"
fi
binaries=$target/compat-core-tests.txt
log "building the core test binaries"
core_binaries "$target" >"$binaries.tmp"
mv "$binaries.tmp" "$binaries"

failed=()
i=0
for tarball in "$@"; do
    ver=$(basename "$tarball" .tar.xz)
    mkdir -p "$target/compat"
    run_release "$tarball" $((base + i)) 2>&1 | tee "$target/compat/$ver.log" || failed+=("$ver")
    i=$((i + 1))
done
log "summary (test result lines; logs in $target/compat/VER.log)"
for tarball in "$@"; do
    ver=$(basename "$tarball" .tar.xz)
    grep -E '^(\[tests\] .*\(/|test result:|\[compat\] )' "$target/compat/$ver.log" | sed "s/^/$ver: /" || true
done
((${#failed[@]} == 0)) || { log "FAILED: ${failed[*]}"; exit 1; }
log "every release passed"
