#!/usr/bin/env bash
# Usage: tests/harness/release-root.sh SUITE build|enter|path [COMMAND...]
#
# A Debian root of another release, for testing berth against the Slurm that
# release ships (trixie: 24.11, sid: 26.05; both need glibc 2.38, so they
# cannot run on the bookworm machine directly).
#
#   build        debootstrap SUITE into the cache (once; reused while its
#                package list is unchanged) with the packages
#                install-deps.sh installs, the machine's CA certificates and
#                /etc/hosts
#   enter CMD    run CMD as root inside it: a mount namespace of its own,
#                the root entered with pivot_root (a chrooted process may not
#                create user namespaces, which berth's holder does), with the
#                machine's /proc, /sys, /dev, this checkout (same path),
#                /root/.cargo and /root/.rustup and the image cache bound
#                in, and fresh /run and /tmp
#   path         print where the root lives
#
# BERTH_RELEASE_ROOT_OPT=DIR (enter): DIR is bound onto the root's /opt, in
# the mount namespace of this run only (tests/compat.sh: a Slurm built from
# source under /opt/slurm-VER); the cached root is never written.
#
# Environment: BERTH_TEST_CACHE_DIR (default /var/cache/berth-test; roots live
# in its roots/ folder), BERTH_DEBIAN_MIRROR (default: the machine's first
# Debian mirror).
set -euo pipefail

suite=${1:?usage: release-root.sh SUITE build|enter|path [COMMAND...]}
verb=${2:?usage: release-root.sh SUITE build|enter|path [COMMAND...]}
shift 2
[[ $suite =~ ^[a-z]+$ ]] || { echo "SUITE must be a Debian suite name (got '$suite')" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "release-root.sh must run as root" >&2; exit 1; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
ROOT=$CACHE/roots/$suite
log() { printf '[release-root %s] %s\n' "$suite" "$*" >&2; }

mirror() {
    if [[ -n ${BERTH_DEBIAN_MIRROR:-} ]]; then
        echo "$BERTH_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n $uri ]] || uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [[ -n $uri ]] || { echo "no Debian mirror found: set BERTH_DEBIAN_MIRROR" >&2; exit 1; }
    echo "$uri"
}

# The packages install-deps.sh wants, read from it (one list for every release).
packages() {
    awk '/^PACKAGES=\(/ {on = 1; next} on && /^\)/ {exit} on {sub(/#.*/, ""); print}' \
        "$REPO/tests/harness/install-deps.sh" | tr -s ' \t' '\n' | sed '/^$/d' | sort -u
}

build() {
    local stamp want tmp
    want=$(packages | sha256sum | cut -c1-16)
    stamp=$ROOT/.berth-root
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
        log "cached at $ROOT"
        return
    fi
    tmp=$ROOT.tmp
    rm -rf --one-file-system "$tmp"
    mkdir -p "$CACHE/roots"
    log "debootstrap --variant=minbase $suite from $(mirror)"
    debootstrap --variant=minbase "$suite" "$tmp" "$(mirror)" >"$CACHE/roots/$suite.debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/roots/$suite.debootstrap.log" >&2; exit 1; }
    cp /usr/local/share/ca-certificates/*.crt "$tmp/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/hosts "$tmp/etc/hosts"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    printf 'deb %s %s main\n' "$(mirror)" "$suite" >"$tmp/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod 0755 "$tmp/usr/sbin/policy-rc.d"
    log "installing $(packages | wc -l) packages"
    mapfile -t pkgs < <(packages)
    # A mirror that serves a frozen copy has Release files past their Valid-Until.
    printf 'Acquire::Check-Valid-Until "false";\n' >"$tmp/etc/apt/apt.conf.d/99berth-mirror"
    # Some maintainer scripts (sid's docker-registry) need /proc.
    mount -t proc proc "$tmp/proc"
    local rc=0
    chroot "$tmp" sh -c 'apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"' \
        sh "${pkgs[@]}" >"$CACHE/roots/$suite.install.log" 2>&1 || rc=$?
    umount "$tmp/proc"
    ((rc == 0)) || { tail -20 "$CACHE/roots/$suite.install.log" >&2; exit 1; }
    chroot "$tmp" update-ca-certificates >/dev/null 2>&1 || true
    chroot "$tmp" apt-get clean
    echo "$want" >"$tmp/.berth-root"
    rm -rf --one-file-system "$ROOT"
    mv "$tmp" "$ROOT"
    log "ready at $ROOT ($(chroot "$ROOT" dpkg-query -W -f '${Version}' slurmd 2>/dev/null || echo '?'))"
}

enter() {
    [[ -f $ROOT/.berth-root ]] || { echo "no root for $suite: run 'release-root.sh $suite build'" >&2; exit 1; }
    (($#)) || set -- bash
    local opt=${BERTH_RELEASE_ROOT_OPT:-}
    [[ -z $opt || -d $opt ]] || { echo "BERTH_RELEASE_ROOT_OPT=$opt is not a folder" >&2; exit 2; }
    [[ -z $opt || -d $ROOT/opt ]] || { echo "$ROOT has no /opt to bind BERTH_RELEASE_ROOT_OPT onto" >&2; exit 1; }
    # shellcheck disable=SC2016
    exec unshare -m --propagation private -- bash -euc '
        root=$1 repo=$2 cache=$3 opt=$4
        shift 4
        mount --rbind "$root" "$root"
        for d in proc sys dev; do mount --rbind "/$d" "$root/$d"; done
        mount -t tmpfs -o mode=0755 tmpfs "$root/run"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        bind() { [[ -e $1 ]] || return 0; mkdir -p "$root$1"; mount --rbind "$1" "$root$1"; }
        bind "$repo"
        bind /root/.cargo
        bind /root/.rustup
        bind "$cache"
        [[ -z $opt ]] || mount --rbind "$opt" "$root/opt"
        cd "$root"
        mkdir -p .oldroot
        pivot_root . .oldroot
        umount -l /.oldroot
        rmdir /.oldroot 2>/dev/null || true
        cd "$repo"
        rc=0
        "$@" || rc=$?
        # Daemons started in here (munged, a cluster left running) would keep
        # this mount namespace, and the machine mounts bound into it, alive.
        me=$(readlink /proc/self/ns/mnt)
        for p in /proc/[0-9]*; do
            pid=${p#/proc/}
            [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
            [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$me" ]] && kill -KILL "$pid" 2>/dev/null
        done
        exit $rc
    ' bash "$ROOT" "$REPO" "$CACHE" "$opt" "$@"
}

case $verb in
build) build ;;
enter) enter "$@" ;;
path) echo "$ROOT" ;;
*) echo "unknown verb '$verb' (build, enter, path)" >&2; exit 2 ;;
esac
