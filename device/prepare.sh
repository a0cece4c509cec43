#!/usr/bin/env bash
# Usage: [SLURM_TAG=slurm-25-05-8-1] [CARRY=.devcarry] device/prepare.sh [REPO]
#
# Puts what device/run-gpu.sh needs on the device machine into REPO/CARRY
# (default: this checkout, .devcarry; the device tool sends the checkout its
# session started in, so run it for that one): a stripped berth built here,
# static busybox, and tar2sqfs with its libraries (the device has no squashfs
# writer). Adds /CARRY/ to the repository's info/exclude, as the device
# tool's carry needs ignored paths. Then call the device tool with
#   carry: [".devcarry"]   command: bash .devcarry/device/run-gpu.sh
#
# With SLURM_TAG (a tag of SchedMD's repository, mirrored at SLURM_GIT), also
# what device/run-slurm.sh needs: that release's source (built on the device,
# which has 16 cores), berth's SPANK plugin built here against that release's
# headers (a quick configure here, only for slurm/slurm_version.h), the
# libdbus-1 headers and libraries Slurm's cgroup/v2 plugin links with, and
# linux/bpf.h (neither is on the device for certain). SLURM_INCLUDE_DIR, if
# set, names a source tree of that tag already configured (no configure
# then). A Slurm prefix a
# previous device call left in its $OUT (slurm-prefix.tar.xz.00, .01, ...)
# is joined from SLURM_PREFIX=DIR/slurm-prefix.tar.xz, so later calls skip
# the build (about 3 minutes). Then:
#   carry: [".devcarry"]
#   command: BERTH_CARRY=$PWD/.devcarry bash .devcarry/device/run-slurm.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=${1:-$HERE}
CARRY=${CARRY:-.devcarry}
C=$REPO/$CARRY
TGT=${CARGO_TARGET_DIR:-$HERE/target}
rm -rf "$C"
mkdir -p "$C/lib" "$C/device"
if [[ -n ${SLURM_TAG:-} ]]; then
    SLURM_GIT=${SLURM_GIT:-/work/.mirror/SchedMD+slurm/repo}
    S=$(mktemp -d)
    git --git-dir="$SLURM_GIT" archive --prefix=slurm/ "$SLURM_TAG" >"$S/src.tar"
    xz -T2 -6 <"$S/src.tar" >"$C/slurm-src.tar.xz"
    if [[ -z ${SLURM_INCLUDE_DIR:-} ]]; then
        tar -C "$S" -xf "$S/src.tar"
        (cd "$S/slurm" && ./configure --without-munge >"$S/configure.log" 2>&1) ||
            { tail "$S/configure.log"; exit 1; }
        export SLURM_INCLUDE_DIR=$S/slurm
    fi
    cargo build --release --manifest-path "$HERE/Cargo.toml"
    strip -o "$C/spank_berth.so" "$TGT/release/libberth.so"
    # libdbus-1: headers and the link library from Debian's -dev package,
    # runtime libraries (with libsystemd's) for a machine without them.
    (cd "$S" && apt-get download libdbus-1-dev >/dev/null 2>&1) && dpkg -x "$S"/libdbus-1-dev_*.deb "$S/dbus"
    mkdir -p "$C/dbus/include" "$C/dbus/lib/dbus-1.0" "$C/dbus/rt"
    cp -r "$S/dbus/usr/include/dbus-1.0" "$C/dbus/include/"
    cp -r "$S/dbus/usr/lib/x86_64-linux-gnu/dbus-1.0/include" "$C/dbus/lib/dbus-1.0/"
    cp -L /lib/x86_64-linux-gnu/libdbus-1.so.3 "$C/dbus/lib/libdbus-1.so.3"
    ln -s libdbus-1.so.3 "$C/dbus/lib/libdbus-1.so"
    cp -L /lib/x86_64-linux-gnu/libdbus-1.so.3 "$C/dbus/rt/"
    ldd /lib/x86_64-linux-gnu/libdbus-1.so.3 | awk '/=> \// {print $3}' | grep -v 'libc.so' |
        xargs -I{} cp -L {} "$C/dbus/rt/"
    mkdir -p "$C/bpf/include/linux"
    cp /usr/include/linux/bpf.h /usr/include/linux/bpf_common.h "$C/bpf/include/linux/"
    [[ -n ${SLURM_PREFIX:-} ]] && cat "$SLURM_PREFIX".* >"$C/slurm-prefix.tar.xz"
    rm -rf "$S"
else
    cargo build --release --manifest-path "$HERE/Cargo.toml" --bin berth
fi
strip -o "$C/berth" "$TGT/release/berth"
cp /usr/bin/busybox "$C/busybox"
cp /usr/bin/tar2sqfs "$C/tar2sqfs"
ldd /usr/bin/tar2sqfs | awk '/=> \// {print $3}' | grep -v 'libc.so' | xargs -I{} cp -L {} "$C/lib/"
cp "$HERE"/device/{run-gpu.sh,run-slurm.sh,cuda_probe.cu,nccl_allreduce.cu} "$C/device/"
exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx "/$CARRY/" "$exclude" 2>/dev/null || echo "/$CARRY/" >>"$exclude"
du -sh "$C"
