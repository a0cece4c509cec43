#!/usr/bin/env bash
# Usage: device/prepare.sh [REPO]
#
# Puts what device/run-gpu.sh needs on the device machine into REPO/.devcarry
# (default: this checkout; the device tool sends the checkout its session
# started in, so run it for that one): a stripped berth built here, static
# busybox, and tar2sqfs with its libraries (the device has no squashfs
# writer). Adds /.devcarry/ to the repository's info/exclude, as the device
# tool's carry needs ignored paths. Then call the device tool with
#   carry: [".devcarry", "device"]   (device/ too where it is not committed)
#   command: bash device/run-gpu.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=${1:-$HERE}
C=$REPO/.devcarry
rm -rf "$C"
mkdir -p "$C/lib"
cargo build --release --manifest-path "$HERE/Cargo.toml" --bin berth
strip -o "$C/berth" "$HERE/target/release/berth"
cp /usr/bin/busybox "$C/busybox"
cp /usr/bin/tar2sqfs "$C/tar2sqfs"
ldd /usr/bin/tar2sqfs | awk '/=> \// {print $3}' | grep -v 'libc.so' | xargs -I{} cp -L {} "$C/lib/"
mkdir -p "$REPO/device"
[[ $REPO == "$HERE" ]] || cp "$HERE"/device/{run-gpu.sh,cuda_probe.cu,nccl_allreduce.cu} "$REPO/device/"
exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
grep -qx '/.devcarry/' "$exclude" 2>/dev/null || echo '/.devcarry/' >>"$exclude"
du -sh "$C"
