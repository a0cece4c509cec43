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

# berth_rust_linters: makes sure `cargo fmt` and `cargo clippy` run (the test
# command checks both first). rustup's minimal profile leaves them out: they
# are then added to the active toolchain with rustup; a toolchain not managed
# by rustup must bring them itself.
berth_rust_linters() {
    local missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    ((${#missing[@]} == 0)) && return 0
    if command -v rustup >/dev/null 2>&1; then
        echo "[rust-env] adding the toolchain components ${missing[*]} (rustup component add)"
        rustup component add "${missing[@]}" || {
            echo "[rust-env] ERROR: rustup component add ${missing[*]} failed; add them by hand and retry" >&2
            return 1
        }
    else
        echo "[rust-env] ERROR: this Rust toolchain has no ${missing[*]} and no rustup to add them:" \
            "install them with the toolchain (or use rustup) and retry" >&2
        return 1
    fi
}
