#!/usr/bin/env bash
# Usage: device/slurm-prefixes.sh prepare REPO TAG...   (here, as root)
#        bash CARRY/slurm-prefixes.sh build TAG...      (on the device machine)
#
# Builds Slurm releases from source on the device machine (16 cores; four
# releases in parallel take about 4 minutes) for compatibility runs in the
# trixie release root (tests/harness/release-root.sh), whose glibc (2.41)
# runs what the device's (2.39) builds.
#
# prepare: fills REPO/.devcarry-compat (ignored through REPO's info/exclude)
# with each TAG's source (git archive of SchedMD's mirror), this script, and
# the trixie root's libmunge, libpmix (pmix2) and libdbus-1 headers and
# libraries (libmunge-dev and libdbus-1-dev fetched with apt-get download in
# the root). Then call the device tool with
#   carry: [".devcarry-compat"]
#   command: bash .devcarry-compat/slurm-prefixes.sh build TAG...
# build: configures each TAG with --prefix=/opt/slurm-VER (VER: 25-11-7 for
# slurm-25-11-7-1), munge and pmix from the carry, multiple-slurmd on,
# optional libraries off,
# builds them at once, and leaves each stripped prefix as $OUT/VER.tar.xz
# (about 3 MiB each) and the build logs in $OUT/logs.tar.xz.
set -euo pipefail
verb=${1:?usage: slurm-prefixes.sh prepare REPO TAG... | build TAG...}
shift

prepare() {
    local repo=${1:?REPO} C root dl d t
    shift
    C=$repo/.devcarry-compat
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local R
    R=$("$root/tests/harness/release-root.sh" trixie path)
    local G=${SLURM_GIT:-/work/.mirror/SchedMD+slurm/repo}
    rm -rf "$C"
    mkdir -p "$C/dep/usr/lib/x86_64-linux-gnu"
    dl=$R/tmp/berth-dl
    rm -rf "$dl"; mkdir -p "$dl"
    chroot "$R" sh -c 'cd /tmp/berth-dl && apt-get download -q libmunge-dev libdbus-1-dev' >/dev/null
    for d in "$dl"/*.deb; do dpkg -x "$d" "$C/dep"; done
    rm -rf "$dl" "$C/dep/usr/share"
    local L=$C/dep/usr/lib/x86_64-linux-gnu
    cp -a "$R/usr/lib/x86_64-linux-gnu/pmix2" "$L/"
    cp -L "$R/usr/lib/x86_64-linux-gnu/libmunge.so.2" "$L/"
    cp -L "$R/usr/lib/x86_64-linux-gnu/libdbus-1.so.3" "$L/" 2>/dev/null ||
        cp -L /lib/x86_64-linux-gnu/libdbus-1.so.3 "$L/"
    ln -sf libmunge.so.2 "$L/libmunge.so"
    ln -sf libdbus-1.so.3 "$L/libdbus-1.so"
    for t in "$@"; do
        git --git-dir="$G" archive --prefix="$t/" "$t" | gzip -1 >"$C/$t.tar.gz" &
    done
    wait
    cp "${BASH_SOURCE[0]}" "$C/slurm-prefixes.sh"
    local exclude
    exclude=$(git -C "$repo" rev-parse --path-format=absolute --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.devcarry-compat/' "$exclude" 2>/dev/null || echo '/.devcarry-compat/' >>"$exclude"
    du -sh "$C"
}

one() {
    local t=$1 v P B
    v=${t#slurm-}; v=${v%-1}; P=/opt/slurm-$v; B=/tmp/b/$t
    mkdir -p /tmp/b
    tar -C /tmp/b -xzf "$C/$t.tar.gz"
    cd "$B"
    # libpmix's own libraries (libevent, hwloc) are not on the device: the
    # links may leave their symbols to the machine that runs Slurm.
    # --enable-multiple-slurmd, as Debian builds it: the test cluster runs
    # every slurmd on one machine with one munged, and without it a node
    # refuses a launch credential another node decoded already (munge's
    # replay check: "_verify_signature: failed decode", srun's "Header
    # lengths are longer than data received").
    ./configure --prefix="$P" --sysconfdir="$P/etc" --with-munge="$D" --with-pmix="$L/pmix2" --disable-debug \
        --enable-multiple-slurmd \
        --without-hwloc --without-json --without-yaml --without-lz4 --without-http-parser --without-jwt \
        --without-rrdtool --without-ucx --without-nvml --without-rsmi --without-hdf5 --without-freeipmi \
        --without-libcurl --without-oneapi --without-selinux --disable-x11 \
        LDFLAGS="-L$L -Wl,--allow-shlib-undefined -Wl,-rpath-link,$L" >"$OUT/$v.log" 2>&1 ||
        { echo "$v: configure failed"; tail -5 "$OUT/$v.log"; return 1; }
    echo "$v configured at $((SECONDS - T0))s"
    { make -j5 -s && make -j5 -s install; } >>"$OUT/$v.log" 2>&1 ||
        { echo "$v: make failed"; tail -15 "$OUT/$v.log"; return 1; }
    echo "$v built at $((SECONDS - T0))s"
    rm -rf "$P/share"
    find "$P" \( -name '*.la' -o -name '*.a' \) -delete
    strip --strip-unneeded "$P"/bin/* "$P"/sbin/* "$P"/lib/*.so* "$P"/lib/slurm/*.so 2>/dev/null || true
    ls "$P/lib/slurm" | grep -E '^(auth_munge|mpi_pmix|cgroup_v2|mpi_pmi2)' | tr '\n' ' '
    tar -C / -cf - "opt/slurm-$v" | xz -T4 -9 >"$OUT/$v.tar.xz"
    echo "$v packed at $((SECONDS - T0))s: $(stat -c %s "$OUT/$v.tar.xz") bytes"
}

build() {
    C=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); D=$C/dep/usr; L=$D/lib/x86_64-linux-gnu
    OUT=${OUT:?OUT: the folder whose files come back}
    export dbus_CFLAGS="-I$D/include/dbus-1.0 -I$L/dbus-1.0/include" dbus_LIBS="-L$L -ldbus-1"
    T0=$SECONDS
    nproc; gcc --version | head -1
    local t rc=0 pids=()
    for t in "$@"; do one "$t" & pids+=($!); done
    for t in "${pids[@]}"; do wait "$t" || rc=1; done
    (cd "$OUT" && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
    ls -la "$OUT"
    echo "all done at $((SECONDS - T0))s (exit $rc)"
    return $rc
}

case $verb in
prepare | build) "$verb" "$@" ;;
*) echo "unknown verb '$verb' (prepare, build)" >&2; exit 2 ;;
esac
