#!/usr/bin/env bash
# Usage: packaging/rpm.sh [OUTDIR]     (also: make rpm)
#
# Builds berth-<version>-1.slurm<MMmm>.<arch>.rpm from this checkout with
# rpmbuild and packaging/berth.spec: the spec's build runs in this checkout
# (rpmbuild --build-in-place), so a cargo target folder that already holds
# berth built against the same headers compiles nothing again. Prints the
# path of the package.
#
# Environment:
#   SLURM_INCLUDE_DIR  the Slurm headers to build against (default
#                      /usr/include, where slurm-devel puts them); a source
#                      build's PREFIX/include works too
#   TARGET_DIR         cargo target folder (default target)
#   BERTH_RPM_VERSION  the package version (default: Cargo.toml's)
#   BERTH_RPM_NODEPS=1 rpmbuild --nodeps: build without slurm-devel, cargo
#                      and clang-devel installed as RPMs (a Debian machine)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
out=${1:-$repo/target/rpm}
version=${BERTH_RPM_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
include=${SLURM_INCLUDE_DIR:-/usr/include}
target=$(realpath -m "${TARGET_DIR:-$repo/target}")
command -v rpmbuild >/dev/null || { echo "rpm.sh: no rpmbuild (dnf install rpm-build, or apt-get install rpm)" >&2; exit 1; }
[[ -r $include/slurm/slurm_version.h ]] ||
    { echo "rpm.sh: no $include/slurm/slurm_version.h: install slurm-devel or set SLURM_INCLUDE_DIR" >&2; exit 1; }

top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
flags=()
[[ ${BERTH_RPM_NODEPS:-0} != 1 ]] || flags+=(--nodeps)
# The build reuses the cargo target folder, and the plugin is stripped of
# debug info like the Debian package's; no debuginfo subpackage.
rpmbuild -bb --build-in-place "${flags[@]}" \
    --define "_topdir $top" \
    --define "berth_version $version" \
    --define "slurm_include $include" \
    --define "cargo_target_dir $target" \
    --define 'debug_package %{nil}' \
    packaging/berth.spec >&2
mkdir -p "$out"
found=("$top"/RPMS/*/berth-*.rpm)
[[ -f ${found[0]} ]] || { echo "rpm.sh: rpmbuild made no package" >&2; exit 1; }
cp "${found[@]}" "$out/"
echo "$out/$(basename "${found[0]}")"
