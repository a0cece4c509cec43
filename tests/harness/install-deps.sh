#!/usr/bin/env bash
# Usage: tests/harness/install-deps.sh
#
# Prepares a Debian 12 machine (run as root) for berth's integration tests:
#   - installs the Debian packages the harness scripts and the crate need
#     (apt-get update only when a package has no install candidate);
#   - makes munge startable (directory ownership, key present);
#   - makes /dev/fuse usable by ordinary users (mode 0666);
#   - creates the test user `berthuser` with supplementary group `berthgrp`,
#     and berthuser2..4 (no extra group) for tests across users;
#   - creates berth's pull user `berth` (a system user; `make install` and the
#     Debian package do the same on a real node).
# Safe to run again: when everything is already there it takes a second or two.
# Package services are not started by the install (a temporary policy-rc.d);
# tests/harness/cluster.sh starts what it needs itself.
set -euo pipefail

PACKAGES=(
    # Slurm 22.05 + munge
    slurmctld slurmd slurm-client libslurm-dev munge
    # MPI
    openmpi-bin libopenmpi-dev libpmix-dev mpich libmpich-dev
    # registry and image tools
    docker-registry skopeo umoci debootstrap debian-archive-keyring busybox-static
    # local container engines (dockerd:// and podman:// image sources)
    docker.io podman uidmap
    # squashfs and FUSE
    squashfs-tools squashfs-tools-ng squashfuse fuse-overlayfs fuse3
    # building the crate (bindgen needs libclang)
    clang libclang-dev build-essential pkg-config
    # harness plumbing
    iproute2 util-linux procps curl jq python3 openssl ca-certificates tar gzip
)
# This machine's only, not the release roots' (release-root.sh installs
# PACKAGES; /.berth-root marks a root): rpmbuild, for tests/suite/package.rs's RPM.
HOST_PACKAGES=(rpm)
[[ ! -e /.berth-root ]] || HOST_PACKAGES=()

TEST_USER=berthuser
TEST_GROUP=berthgrp
# More ordinary users, for tests of one user against another and of many
# users at once (not in berthgrp).
OTHER_USERS=(berthuser2 berthuser3 berthuser4)

log() { printf '[install-deps] %s\n' "$*"; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
[[ -r /etc/debian_version ]] || die "this script expects Debian 12 (bookworm)"

missing_packages() {
    local p status
    for p in "${PACKAGES[@]}" "${HOST_PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || printf '%s\n' "$p"
    done
}

has_candidates() {
    local p cand
    for p in "$@"; do
        cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
        [[ -n $cand && $cand != "(none)" ]] || return 1
    done
}

install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    if ((${#missing[@]} == 0)); then
        log "all ${#PACKAGES[@]} packages already installed"
        return
    fi
    log "missing packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! has_candidates "${missing[@]}"; then
        log "apt-get update (package lists are missing or stale)"
        apt-get update -q
    fi
    # Keep package maintainer scripts from starting daemons (docker-registry
    # on :5000, munge, slurmd...): the harness starts its own instances.
    local policy=/usr/sbin/policy-rc.d
    local made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        made_policy=1
    fi
    local rc=0
    apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}" || rc=$?
    ((made_policy)) && rm -f "$policy"
    ((rc == 0)) || die "apt-get install failed (exit $rc)"
    log "installed: ${missing[*]}"
}

fix_munge() {
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then
            mungekey --create --force --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    log "munge directories and key ready"
}

fix_fuse() {
    if [[ ! -e /dev/fuse ]]; then
        modprobe fuse 2>/dev/null || true
    fi
    if [[ -c /dev/fuse ]]; then
        chmod 0666 /dev/fuse
        log "/dev/fuse is mode 0666"
    else
        log "WARNING: /dev/fuse does not exist; squashfuse tests will fail"
    fi
}

make_test_user() {
    getent group "$TEST_GROUP" >/dev/null || groupadd "$TEST_GROUP"
    if ! id -u "$TEST_USER" >/dev/null 2>&1; then
        useradd -m -s /bin/bash -G "$TEST_GROUP" "$TEST_USER"
        log "created user $TEST_USER (groups: $(id -Gn "$TEST_USER"))"
    elif [[ " $(id -Gn "$TEST_USER") " != *" $TEST_GROUP "* ]]; then
        usermod -a -G "$TEST_GROUP" "$TEST_USER"
        log "added $TEST_USER to $TEST_GROUP"
    else
        log "user $TEST_USER exists (groups: $(id -Gn "$TEST_USER"))"
    fi
    local u
    for u in "${OTHER_USERS[@]}"; do
        if ! id -u "$u" >/dev/null 2>&1; then
            useradd -m -s /bin/bash "$u"
            log "created user $u"
        fi
    done
    # The unprivileged user berth pulls images as (plugstack pull_user).
    if ! id -u berth >/dev/null 2>&1; then
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin --comment 'berth image puller' berth
        log "created the pull user berth"
    fi
}

start=$SECONDS
install_packages
fix_munge
fix_fuse
make_test_user
log "done in $((SECONDS - start))s"
