#!/usr/bin/env bash
# Usage: packaging/deb.sh [OUTDIR]     (also: make deb)
#
# Builds berth_<version>_<arch>.deb from this checkout with dpkg-deb: the CLI in
# /usr/bin, the plugin in Slurm's plugin folder (/usr/lib/<multiarch>/slurm-wlm),
# the plugstack drop-in in /etc/slurm/plugstack.conf.d (a conffile: local edits
# survive upgrades), the docs in /usr/share/doc/berth. The package depends on
# the Slurm release whose headers it was built against (the plugin refuses any
# other release). Its maintainer scripts: postinst creates the system user
# `berth` that image pulls run as (plugstack pull_user) and, where AppArmor 4
# is installed, puts the CLI's profile (packaging/apparmor/berth) in
# /etc/apparmor.d and loads it; postrm takes the profile away. It honours DPKG_ROOT
# (dpkg --root=DIR --force-script-chrootless, as tests/suite/package.rs installs):
# the user goes into that root's /etc/passwd, or, when the root has none, a
# note says so and nothing else happens.
#
# Upgrading under running jobs is safe: dpkg unpacks each file beside the old
# one and renames it into place, so a slurmstepd that has the old plugin mapped
# and a running `berth` helper keep their old files; new steps load the new ones.
#
# One package per Slurm release: the Depends line names the release of the
# headers berth is built against, SLURM_INCLUDE_DIR/slurm/slurm_version.h
# (as build.rs reads them; default /usr/include). Debian's 22.05 (bookworm),
# 24.11 (trixie) and 26.05 (sid) all keep their plugins in
# /usr/lib/<multiarch>/slurm-wlm. For another release's root, build there
# first and package the result here (tests/release.sh does):
#
#   SLURM_INCLUDE_DIR=target/slurm-trixie/include TARGET_DIR=target/slurm-trixie packaging/deb.sh
#
# BERTH_DEB_FLAVOUR=smd packages for SchedMD's own Debian packages instead:
# Depends on slurm-smd of the release, the plugin in /usr/lib/<multiarch>/slurm
# (their debian/rules configures with the default libdir).
#
# Environment: BERTH_DEB_VERSION (default: Cargo.toml's version),
# TARGET_DIR (cargo target folder, default target), SLURM_INCLUDE_DIR,
# BERTH_DEB_FLAVOUR (debian, the default, or smd), BERTH_DEB_PREBUILT=1
# (package what TARGET_DIR holds, without running cargo).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/target/debian}
version=${BERTH_DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)}
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
case ${BERTH_DEB_FLAVOUR:-debian} in
debian) plugindir=/usr/lib/$multiarch/slurm-wlm slurm_package=slurm-wlm-basic-plugins ;;
smd) plugindir=/usr/lib/$multiarch/slurm slurm_package=slurm-smd ;;
*) echo "deb.sh: BERTH_DEB_FLAVOUR must be debian or smd (got '$BERTH_DEB_FLAVOUR')" >&2; exit 2 ;;
esac
header=${SLURM_INCLUDE_DIR:-/usr/include}/slurm/slurm_version.h
number=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\)/\1/p' "$header" 2>/dev/null || true)
[[ -n $number ]] || { echo "deb.sh: no SLURM_VERSION_NUMBER in $header (install libslurm-dev, or set SLURM_INCLUDE_DIR to the headers berth is built against)" >&2; exit 1; }
slurm_major=$((number >> 16 & 0xff))
slurm_minor=$(printf '%02d' $((number >> 8 & 0xff)))
next_minor=$(printf "%02d" $(((number >> 8 & 0xff) + 1)))
slurm=$slurm_major.$slurm_minor.$((number & 0xff))
[[ -n $version && -n $slurm ]] || { echo "deb.sh: cannot read the versions" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install=install
[[ ${BERTH_DEB_PREBUILT:-0} != 1 ]] || install=install-built
make -C "$repo" --no-print-directory "$install" DESTDIR="$stage/root" PREFIX=/usr \
    PLUGINDIR="$plugindir" PLUGSTACK_DIR=/etc/slurm/plugstack.conf.d \
    TARGET_DIR="${TARGET_DIR:-$repo/target}" >&2
root=$stage/root
# Debug info stays in the build tree; the package carries stripped files.
strip --strip-debug "$root/usr/bin/berth" "$root$plugindir/spank_berth.so"
install -d "$root/usr/share/doc/berth"
install -m 0644 "$repo"/README.md "$repo"/docs/*.md "$root/usr/share/doc/berth/"
# The AppArmor profile for the CLI's user namespaces: postinst puts it in
# place where AppArmor 4 can parse it (packaging/apparmor/berth says why).
install -D -m 0644 "$repo/packaging/apparmor/berth" "$root/usr/share/berth/apparmor/berth"
# A ready site profile for the node's InfiniBand userspace (to copy to
# /etc/berth/inject.d; packaging/inject.d/infiniband.conf says how).
install -D -m 0644 "$repo/packaging/inject.d/infiniband.conf" "$root/usr/share/berth/inject.d/infiniband.conf"
install -d "$root/DEBIAN"
size=$(du -sk "$root/usr" "$root/etc" | awk '{s += $1} END {print s}')
cat >"$root/DEBIAN/control" <<CONTROL
Package: berth
Version: $version
Architecture: $arch
Maintainer: berth developers <berth@localhost>
Installed-Size: $size
Depends: passwd, squashfs-tools-ng, $slurm_package (>= $slurm_major.$slurm_minor), $slurm_package (<< $slurm_major.$next_minor)
Recommends: squashfuse, fuse-overlayfs
Section: admin
Priority: optional
Description: run Slurm jobs inside OCI container images
 berth adds --container-image and the other pyxis options to srun, sbatch and
 salloc: images are pulled from OCI registries into squashfs files on
 node-local storage, mounted (never unpacked) and entered with user
 namespaces. Built for Slurm $slurm.
CONTROL
echo /etc/slurm/plugstack.conf.d/berth.conf >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
# Creates the unprivileged system user berth pulls images as (pull_user).
set -e
if [ "$1" = configure ]; then
    passwd="${DPKG_ROOT:-}/etc/passwd"
    if [ ! -e "$passwd" ]; then
        echo "berth: $passwd does not exist: create the pull user berth in that system yourself" >&2
    elif ! grep -q '^berth:' "$passwd"; then
        if [ -n "${DPKG_ROOT:-}" ]; then
            set -- --prefix "$DPKG_ROOT"
        else
            set --
        fi
        useradd "$@" --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin --comment 'berth image puller' berth
        echo "berth: created the system user berth that image pulls run as" >&2
    fi
    # The CLI's AppArmor profile, where AppArmor 4 restricts user namespaces.
    etc="${DPKG_ROOT:-}/etc/apparmor.d"
    if [ -e "$etc/abi/4.0" ]; then
        cp "${DPKG_ROOT:-}/usr/share/berth/apparmor/berth" "$etc/berth"
        if [ -z "${DPKG_ROOT:-}" ] && command -v apparmor_parser >/dev/null 2>&1 &&
            [ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" = Y ]; then
            apparmor_parser -r -T -W "$etc/berth" ||
                echo "berth: cannot load $etc/berth: ordinary users' berth run may lack user namespaces" >&2
        fi
    fi
fi
exit 0
POSTINST
chmod 0755 "$root/DEBIAN/postinst"
cat >"$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
# Takes away the AppArmor profile postinst put in place.
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
    profile="${DPKG_ROOT:-}/etc/apparmor.d/berth"
    if [ -e "$profile" ]; then
        if [ -z "${DPKG_ROOT:-}" ] && command -v apparmor_parser >/dev/null 2>&1; then
            apparmor_parser -R "$profile" 2>/dev/null || true
        fi
        rm -f "$profile"
    fi
fi
exit 0
POSTRM
chmod 0755 "$root/DEBIAN/postrm"
mkdir -p "$out"
deb="$out/berth_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >&2
echo "$deb"
