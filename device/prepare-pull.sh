#!/usr/bin/env bash
# Usage: [CARRY=.devcarry] [BERTH=path/to/berth] device/prepare-pull.sh [REPO]
#
# Puts what device/pull-small.sh needs on the device machine into REPO/CARRY
# (default: this checkout, .devcarry; replaced): a stripped berth (BERTH, or
# target/release/berth after a `cargo build --release --locked --bin berth`,
# a no-op when it is current), Debian's docker-registry (distribution 2.8,
# it needs only the C library; any other library it links goes to lib/),
# static busybox (its wget stands in for curl where the device has none),
# bench/make-small-image.py, bench/make-image.py (imported by it),
# bench/peak-rss.py, and device/pull-small.sh itself. Adds /CARRY/ to the
# repository's info/exclude, as the device tool's carry needs ignored paths.
# About 32 MiB. Then call the device tool (kind nvidia-h200) with
#   carry: [".devcarry"]   command: bash .devcarry/device/pull-small.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=${1:-$HERE}
CARRY=${CARRY:-.devcarry}
C=$REPO/$CARRY
if [[ -z ${BERTH:-} ]]; then
    [[ -f $HERE/tests/harness/rust-env.sh ]] && source "$HERE/tests/harness/rust-env.sh"
    cargo build --release --locked --manifest-path "$HERE/Cargo.toml" --bin berth
    BERTH=${CARGO_TARGET_DIR:-$HERE/target}/release/berth
fi
REGISTRY=${REGISTRY:-$(command -v docker-registry)}
rm -rf "$C"
mkdir -p "$C/lib" "$C/bench" "$C/device"
strip -o "$C/berth" "$BERTH"
cp "$REGISTRY" "$C/docker-registry"
ldd "$REGISTRY" | awk '/=> \// && $1 !~ /^lib(c|pthread)\.so/ {print $3}' | xargs -r -I{} cp -L {} "$C/lib/"
cp /usr/bin/busybox "$C/busybox"
cp "$HERE"/bench/{make-small-image.py,make-image.py,peak-rss.py} "$C/bench/"
cp "$HERE/device/pull-small.sh" "$C/device/"
exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
[[ $exclude == /* ]] || exclude=$REPO/$exclude
mkdir -p "$(dirname "$exclude")"
grep -qx "/$CARRY/" "$exclude" 2>/dev/null || echo "/$CARRY/" >>"$exclude"
du -sh "$C"
