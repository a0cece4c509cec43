# shellcheck shell=bash
# Usage: source tests/harness/rust-env.sh
#
# Puts the Rust toolchain on PATH (rustup's ~/.cargo/bin, or the system's)
# and checks it is new enough for berth (Rust 1.88: the locked dependencies need it).
# It does not download a toolchain: install one with rustup if this fails.
if ! command -v cargo >/dev/null 2>&1; then
    for dir in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin /usr/local/cargo/bin; do
        if [[ -x $dir/cargo ]]; then
            export PATH=$dir:$PATH
            break
        fi
    done
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "[rust-env] ERROR: cargo not found; install Rust >= 1.88 (rustup) and retry" >&2
    return 1 2>/dev/null || exit 1
fi
_berth_rustc_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if [[ ! $_berth_rustc_minor =~ ^[0-9]+$ ]] || ((_berth_rustc_minor < 88)); then
    echo "[rust-env] ERROR: $(rustc --version) is too old; berth needs Rust >= 1.88" >&2
    return 1 2>/dev/null || exit 1
fi
unset _berth_rustc_minor
